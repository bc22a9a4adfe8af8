"""/tokenize, /detokenize and /version in vLLM's shapes; usage with n > 1; logprobs' text offsets
and bytes from the tokens' real bytes (tiny models: one token per byte, ids 256-258 special)."""

from __future__ import annotations

import json

import httpx
from server_harness import error_of

from radixflow import __version__

CHAT = "/v1/chat/completions"
TEXT = "héllo 日本"  # 1-, 2- and 3-byte characters: 13 byte tokens


def _tokenize(live, **body) -> dict:
    r = live.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_tokenize_and_detokenize_round_trip(hybrid_server):
    out = _tokenize(hybrid_server, prompt=TEXT, return_token_strs=True)
    assert out["tokens"] == list(TEXT.encode("utf-8"))  # the byte tokenizer: id = byte value
    assert out["count"] == 13 and out["max_model_len"] == 2048
    assert out["token_strs"][0] == "h" and out["token_strs"][1] == "token_id:195"  # half of "é"
    assert _tokenize(hybrid_server, prompt="x")["token_strs"] is None
    r = hybrid_server.post("/detokenize", json={"tokens": out["tokens"]})
    assert r.status_code == 200 and r.json() == {"prompt": TEXT}


def test_tokenize_chat_counts_what_the_chat_endpoint_sends(hybrid_server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT}]
    out = _tokenize(hybrid_server, messages=messages)
    r = hybrid_server.post(CHAT, json={"messages": messages, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == out["count"]
    bare = _tokenize(hybrid_server, messages=messages, add_generation_prompt=False)
    assert out["tokens"][:bare["count"]] == bare["tokens"] and out["count"] > bare["count"]


def test_tokenize_refuses_what_it_does_not_support(hybrid_server):
    r = hybrid_server.post("/tokenize", json={"prompt": "a", "truncate": 3})
    assert r.status_code == 400 and error_of(r)["param"] == "truncate"
    r = hybrid_server.post("/tokenize", json={"model": "other", "prompt": "a"})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = hybrid_server.post("/tokenize", json={})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    r = hybrid_server.post("/detokenize", json={"tokens": [1, 512]})
    assert r.status_code == 400 and "token id 512 is outside the vocabulary" in error_of(r)["message"]
    r = hybrid_server.post("/detokenize", json={"tokens": [-1]})
    assert r.status_code == 400 and error_of(r)["param"] == "tokens.0"


def test_version(hybrid_server):
    r = httpx.get(hybrid_server.url + "/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": __version__}


def test_usage_counts_each_prompt_once_with_n(hybrid_server):
    a, b = _tokenize(hybrid_server, prompt="first prompt")["count"], _tokenize(hybrid_server, prompt="two")["count"]
    body = {"prompt": ["first prompt", "two"], "n": 3, "max_tokens": 2, "ignore_eos": True, "temperature": 1}
    usage = hybrid_server.post("/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens"] == a + b and usage["completion_tokens"] == 12
    assert usage["total_tokens"] == a + b + 12
    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 2, "ignore_eos": True}
    count = _tokenize(hybrid_server, messages=chat["messages"])["count"]
    usage = hybrid_server.post(CHAT, json=chat).json()["usage"]
    assert usage["prompt_tokens"] == count and usage["completion_tokens"] == 8
    assert usage["prompt_tokens_details"]["cached_tokens"] <= count


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_text_offset_is_the_position_in_the_decoded_text(hybrid_server):
    body = {"prompt": TEXT, "echo": True, "logprobs": 1, "max_tokens": 12, "ignore_eos": True,
            "temperature": 0, "return_tokens_as_token_ids": True}
    choice = hybrid_server.post("/v1/completions", json=body).json()["choices"][0]
    lp = choice["logprobs"]
    ids = _ids(lp["tokens"])
    assert ids[:13] == list(TEXT.encode("utf-8"))
    # 'h' é(2 bytes) 'l' 'l' 'o' ' ' 日(3) 本(3): a continuation byte starts where its character does
    assert lp["text_offset"][:13] == [0, 1, 2, 2, 3, 4, 5, 6, 7, 7, 7, 8, 8]
    assert lp["text_offset"][13] == len(TEXT)  # the first generated token starts after the echo
    text = choice["text"]
    assert text.startswith(TEXT)
    for i, off in enumerate(lp["text_offset"]):  # wherever a prefix decodes cleanly, its length is the offset
        head = bytes(t for t in ids[:i] if t < 256).decode("utf-8", errors="replace")
        if "\ufffd" not in head:
            assert off == len(head) and text[:off] == head
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # streamed: the offsets go on across chunks
    streamed = []
    with httpx.stream("POST", hybrid_server.url + "/v1/completions", timeout=60,
                      json={**body, "echo": False, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                if c["logprobs"]:
                    streamed += c["logprobs"]["text_offset"]
    assert streamed == [o - len(TEXT) for o in lp["text_offset"][13:]]


def test_chat_logprob_bytes_are_the_tokens_real_bytes(hybrid_server):
    body = {"messages": [{"role": "user", "content": TEXT}], "logprobs": True, "top_logprobs": 3,
            "max_tokens": 12, "temperature": 0, "return_tokens_as_token_ids": True}
    content = hybrid_server.post(CHAT, json=body).json()["choices"][0]["logprobs"]["content"]
    specials = {256: b"<|endoftext|>", 257: b"<|im_start|>", 258: b"<|im_end|>"}

    def real(token_id: int) -> list[int]:
        if token_id < 256:
            return [token_id]
        return list(specials.get(token_id, b""))  # ids past the tokenizer's pieces stand for no bytes

    entries = [e for c in content for e in (c, *c["top_logprobs"])]
    assert len(entries) == 12 * 4
    for e in entries:
        assert e["bytes"] == real(int(e["token"].removeprefix("token_id:"))), e


def test_usage_with_n_through_the_openai_client(hybrid_server):
    client = hybrid_server.client()
    count = _tokenize(hybrid_server, prompt="openai n")["count"]
    out = client.completions.create(model="tiny-qwen3.5", prompt="openai n", n=4, max_tokens=3,
                                    extra_body={"ignore_eos": True})
    assert len(out.choices) == 4
    assert out.usage.prompt_tokens == count and out.usage.completion_tokens == 12
