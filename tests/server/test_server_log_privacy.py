"""A marker string sent through every endpoint, in good requests and in bad ones (validation errors
that quote the input, malformed JSON, a template error, a 401, a 413, a broken HTTP request), is
nowhere in the server process's stdout and stderr at the default log level."""

from __future__ import annotations

import json
import socket

import httpx
from serve_process import ServeProcess

MARKER = "zq7PRIVATEMARKERpx"
KEY = "privacy-key"


def _requests(url: str) -> list[tuple[str, str, dict]]:
    """(method, path, httpx kwargs): every endpoint, good and bad, each with the marker somewhere."""
    user = [{"role": "user", "content": f"tell me about {MARKER}"}]
    ok = [("POST", "/v1/completions", {"prompt": MARKER, "max_tokens": 4, "echo": True, "logprobs": 2}),
          ("POST", "/v1/completions", {"prompt": [MARKER, MARKER + "b"], "max_tokens": 2, "return_token_ids": True}),
          ("POST", "/v1/completions", {"prompt": MARKER, "max_tokens": 4, "stream": True, "echo": True}),
          ("POST", "/v1/completions", {"prompt": MARKER, "max_tokens": 2, "stop": [MARKER]}),
          ("POST", "/v1/chat/completions", {"messages": user, "max_tokens": 4, "return_prompt_text": True}),
          ("POST", "/v1/chat/completions", {"messages": user, "max_tokens": 4, "stream": True}),
          ("POST", "/v1/chat/completions", {"messages": [*user, {"role": "assistant", "content": MARKER}],
                                            "echo": True, "add_generation_prompt": False,
                                            "continue_final_message": True, "max_tokens": 2}),
          ("POST", "/tokenize", {"prompt": MARKER, "return_token_strs": True}),
          ("POST", "/tokenize", {"messages": user}),
          ("GET", "/v1/models", None), ("GET", f"/v1/models?q={MARKER}", None), ("GET", "/debug/cache", None)]
    bad = [("POST", "/v1/completions", {"prompt": MARKER, MARKER: 1}),  # unknown field
           ("POST", "/v1/completions", {"prompt": MARKER, "temperature": MARKER}),  # wrong type, echoed
           ("POST", "/v1/completions", {"prompt": {MARKER: MARKER}}),
           ("POST", "/v1/completions", {"prompt": MARKER, "max_tokens": 100000}),  # past max_model_len
           ("POST", "/v1/completions", {"prompt": MARKER, "guided_regex": f"({MARKER}"}),  # a bad regex
           ("POST", "/v1/completions", {"prompt": MARKER, "model": MARKER}),  # 404 model
           ("POST", "/v1/chat/completions", {"messages": [{"role": MARKER, "content": MARKER}]}),
           ("POST", "/v1/chat/completions", {"messages": user,
                                             "chat_template": "{{ raise_exception('" + MARKER + "') }}"}),
           ("POST", "/tokenize", {"prompt": MARKER, "messages": MARKER}),
           ("POST", "/detokenize", {"tokens": [MARKER]}),
           ("POST", "/v1/nothing", {"prompt": MARKER})]
    out = [(m, p, {"json": b}) for m, p, b in ok + bad]
    raw = [b'{"prompt": "' + MARKER.encode() + b'", ',  # malformed JSON
           b'{"prompt": "' + MARKER.encode() + b'\\ud800"}',  # a lone surrogate
           b'{"prompt": "' + MARKER.encode() * 70000 + b'"}']  # over --max-body-size: 413
    out += [("POST", "/v1/completions", {"content": r, "headers": {"content-type": "application/json"}}) for r in raw]
    return out


def test_no_prompt_or_completion_text_in_the_logs():
    with ServeProcess("--api-key", KEY, "--debug-endpoints", "--max-model-len", "512", "--max-body-size", "1MiB") as sp:
        url = sp.wait_ready()
        statuses, bodies = [], []
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http:
            for method, path, kw in _requests(url):
                r = http.request(method, path, **kw)
                statuses.append(r.status_code)
                bodies.append(r.text)
            ids = http.post("/tokenize", json={"prompt": MARKER}).json()["tokens"]
            r = http.post("/detokenize", json={"tokens": ids})
            assert r.json()["prompt"] == MARKER
            # a missing key and a key that is the marker: both 401, neither logged
            for headers in ({"Authorization": ""}, {"Authorization": f"Bearer {MARKER}"}):
                r = http.post("/v1/completions", json={"prompt": MARKER}, headers=headers)
                assert r.status_code == 401
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=60) as s:
            s.sendall(f"GET /{MARKER} HTTP/1.1 {MARKER}\r\n\r\n".encode())  # not HTTP: uvicorn's 400
            assert b"400" in s.recv(4096)
        output = sp.stop()
    # the requests did what they should: the marker came back in responses, and errors were errors
    assert sum(s == 200 for s in statuses) == 12 and {400, 404, 413} <= set(statuses), statuses
    assert all(MARKER in bodies[i] for i in (0, 2, 4, 6))  # echoed prompts, the rendered prompt text
    assert any("chat template failed" in b and MARKER in b for b in bodies)  # echoed to the client only
    assert json.loads(bodies[1])["choices"][1]["prompt_token_ids"]  # the ids were returned
    # the log was captured and is informative, yet holds none of the text
    assert '"POST /v1/completions HTTP/1.1" 200' in output and '"GET /v1/models?… HTTP/1.1" 200' in output
    assert '"POST /v1/completions HTTP/1.1" 401' in output and "Invalid HTTP request received" in output
    assert MARKER not in output, [line for line in output.splitlines() if MARKER in line]
    assert KEY not in output
