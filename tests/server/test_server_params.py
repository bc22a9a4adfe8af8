"""Request parameters over real HTTP (the `openai` client and raw httpx), each checked by its effect:
penalties against vLLM's formulas, logit_bias, min_tokens, stops and stop_reason, allowed/bad tokens,
truncation, cache_salt, priority, prompt logprobs, templates, nulls as defaults, and refusals."""

from __future__ import annotations

import math
import random

import httpx
import pytest
import torch
from server_harness import error_of

from fidelity import reference
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.sampling import SamplingParams

MODEL = "tiny-qwen3.5"
EOS = 258  # <|im_end|>, the tiny models' eos_token_id


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def _prompt_logprob_reference(prompt: list[int]):
    """transformers' float64 logprob of each prompt token after the first (fidelity.py)."""
    from transformers import AutoModelForCausalLM

    from radixflow.engine.tiny import resolve_model

    hf = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL), dtype=torch.float32).eval()
    n = len(prompt)
    return reference(hf, prompt).log_softmax()[torch.arange(n - 1), torch.tensor(prompt[1:])]


def _top(entry: dict) -> dict[int, float]:
    return {int(k.removeprefix("token_id:")): v for k, v in entry.items()}


# ------------------------------------------------------------------------------------------ penalties
@pytest.mark.parametrize("freq, pres", [(1.5, 0.0), (0.0, 1.5), (0.7, 0.7)])
def test_frequency_and_presence_penalties_pick_the_penalized_argmax(hybrid_server, freq, pres):
    """Greedy over three allowed tokens, token 65 favoured by a logit bias: every chosen token is the
    argmax of raw logprob (reported for the three) + bias - f * count - p * (count > 0) over the
    tokens generated so far; without penalties the bias makes the run repeat 65."""
    client = hybrid_server.client()
    three, bias = [65, 66, 67], {65: 3.0}
    kw = dict(model=MODEL, prompt=_ids(1, 30), max_tokens=12, temperature=0, logprobs=0,
              logit_bias={str(k): v for k, v in bias.items()},
              extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, "allowed_token_ids": three,
                          "logprob_token_ids": three})
    plain = client.completions.create(**kw).choices[0]
    out = client.completions.create(**kw, frequency_penalty=freq, presence_penalty=pres).choices[0]
    chosen = [int(t.removeprefix("token_id:")) for t in out.logprobs.tokens]
    for i, top in enumerate(out.logprobs.top_logprobs):
        seen = chosen[:i]
        assert set(_top(top)) == set(three)
        scores = {t: lp + bias.get(t, 0) - freq * seen.count(t) - pres * (t in seen) for t, lp in _top(top).items()}
        assert chosen[i] == max(scores, key=scores.get)
    base = [int(t.removeprefix("token_id:")) for t in plain.logprobs.tokens]
    assert base.count(65) > chosen.count(65)


def test_repetition_penalty_rescales_the_logits_of_prompt_tokens(hybrid_server):
    """vLLM's rule on the first token: a prompt token's logit is divided by r when positive and
    multiplied by r when negative; the answer is the argmax of the rescaled logits."""
    prompt = list(range(256))
    random.Random(3).shuffle(prompt)
    eng = Engine(EngineConfig(model=MODEL, kv_cache_memory=16 << 20, max_model_len=1024), keep_logits=True)
    b = eng.make_branch("probe", 0, prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    eng.add([b])
    while eng.has_unfinished:
        batch, _ = eng.step()
        if not batch:  # held by admission: move the virtual clock to its deadline
            eng.now = max(eng.now, eng.idle_until())
    logits = b.user_data.prompt_logits
    r = 3.0
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen[prompt] = True
    penalized = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    assert int(penalized.argmax()) != int(logits.argmax())
    client = hybrid_server.client()
    for rp, expected in ((1.0, logits.argmax()), (r, penalized.argmax())):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=0,
                                        extra_body={"repetition_penalty": rp, "ignore_eos": True,
                                                    "return_tokens_as_token_ids": True})
        assert out.choices[0].logprobs.tokens == [f"token_id:{int(expected)}"]


# ------------------------------------------------------------------------------------- token controls
def test_logit_bias_forces_a_token_in_both_endpoints(hybrid_server):
    client = hybrid_server.client()
    out = client.completions.create(model=MODEL, prompt="hello", max_tokens=5, temperature=1.0, seed=1,
                                    logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text == "AAAAA"
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, logit_bias={"66": 100}, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == "BBBB"


def test_min_tokens_suppresses_eos(hybrid_server):
    client = hybrid_server.client()
    bias = {str(EOS): 100}
    eager = client.completions.create(model=MODEL, prompt="abc", max_tokens=20, temperature=0, logit_bias=bias)
    assert eager.choices[0].finish_reason == "stop" and eager.usage.completion_tokens == 1
    held = client.completions.create(model=MODEL, prompt="abc", max_tokens=20, temperature=0, logit_bias=bias,
                                     extra_body={"min_tokens": 5})
    # five tokens without EOS, then the EOS the bias asks for
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 6
    assert held.choices[0].model_extra["stop_reason"] is None  # EOS has no stop_reason


def test_stop_strings_and_stop_token_ids_give_stop_reason(hybrid_server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 10, "temperature": 0, "logit_bias": {"65": 100}}
    r = hybrid_server.post("/v1/completions", json={**body, "stop": ["AAA"]}).json()["choices"][0]
    assert (r["text"], r["finish_reason"], r["stop_reason"]) == ("", "stop", "AAA")
    r = hybrid_server.post("/v1/completions", json={**body, "stop": ["AAA"], "include_stop_str_in_output": True})
    assert r.json()["choices"][0]["text"] == "AAA"
    r = hybrid_server.post("/v1/completions", json={**body, "stop_token_ids": [65]}).json()["choices"][0]
    assert (r["finish_reason"], r["stop_reason"]) == ("stop", 65)
    r = hybrid_server.post("/v1/completions", json={**body, "stop": ["AAA"], "min_tokens": 4}).json()
    # a stop string counts once it ends past the first min_tokens - 1 = 3 tokens: "AAA" at 1..4
    assert r["choices"][0]["text"] == "A" and r["usage"]["completion_tokens"] == 4
    r = hybrid_server.post("/v1/completions", json={**body, "max_tokens": 3}).json()["choices"][0]
    assert (r["finish_reason"], r["stop_reason"]) == ("length", None)


def test_allowed_token_ids_and_bad_words(hybrid_server):
    client = hybrid_server.client()
    out = client.completions.create(model=MODEL, prompt="q", max_tokens=16, temperature=1.0, seed=2,
                                    extra_body={"allowed_token_ids": [120, 121], "ignore_eos": True})
    assert set(out.choices[0].text) <= {"x", "y"} and len(out.choices[0].text) == 16
    body = {"model": MODEL, "prompt": "q", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logit_bias": {"65": 100, "66": 50}}
    assert hybrid_server.post("/v1/completions", json=body).json()["choices"][0]["text"] == "AAAAAA"
    text = hybrid_server.post("/v1/completions", json={**body, "bad_words": ["A"]}).json()["choices"][0]["text"]
    assert text == "BBBBBB"
    # a two-token bad word: "B" may start it, but "BA" may never complete
    text = hybrid_server.post("/v1/completions", json={**body, "logit_bias": {"65": 100, "66": 100.0},
                                                       "bad_words": ["AA"]}).json()["choices"][0]["text"]
    assert "AA" not in text and len(text) == 6


def test_skip_special_tokens(hybrid_server):
    body = {"model": MODEL, "prompt": "q", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "logit_bias": {"257": 100}}
    assert hybrid_server.post("/v1/completions", json=body).json()["choices"][0]["text"] == ""
    r = hybrid_server.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()
    assert r["choices"][0]["text"] == "<|im_start|><|im_start|>"


def test_min_p_and_logprob_token_ids(hybrid_server):
    client = hybrid_server.client()
    kw = dict(model=MODEL, prompt=_ids(4, 20), max_tokens=8, temperature=1.0, logprobs=1)
    out = client.completions.create(**kw, seed=5, extra_body={"min_p": 0.9, "ignore_eos": True,
                                                               "return_tokens_as_token_ids": True})
    for lp, top in zip(out.choices[0].logprobs.token_logprobs, out.choices[0].logprobs.top_logprobs):
        assert lp >= max(top.values()) + math.log(0.9) - 1e-5  # min_p kept only near-top tokens
    named = client.completions.create(**kw, seed=5, extra_body={"logprob_token_ids": [97, 98],
                                                                 "ignore_eos": True})
    assert all(set(t) == {"a", "b"} for t in named.choices[0].logprobs.top_logprobs)


# ------------------------------------------------------------------------------------ prompt handling
def test_truncate_prompt_tokens_keeps_the_end_or_the_start(hybrid_server):
    body = {"model": MODEL, "prompt": "abcdefghij", "max_tokens": 1, "echo": True, "temperature": 0}
    r = hybrid_server.post("/v1/completions", json={**body, "truncate_prompt_tokens": 4}).json()
    assert r["usage"]["prompt_tokens"] == 4 and r["choices"][0]["text"].startswith("ghij")
    r = hybrid_server.post("/v1/completions", json={**body, "truncate_prompt_tokens": 4,
                                                    "truncation_side": "right"}).json()
    assert r["choices"][0]["text"].startswith("abcd")


def test_prompt_logprobs_and_echo_logprobs(hybrid_server):
    prompt = _ids(9, 70)  # past one --state-interval: a second call would hit the cache without care
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2,
            "return_tokens_as_token_ids": True}
    first = hybrid_server.post("/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    again = hybrid_server.post("/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    assert first[0] is None and len(first) == len(prompt)
    for q in range(1, len(prompt)):
        entry = first[q]
        assert str(prompt[q]) in entry and len(entry) in (2, 3)
        ranks = {v["rank"] for k, v in entry.items() if k != str(prompt[q])}
        assert ranks <= {1, 2}
    echo = hybrid_server.post("/v1/completions", json={**body, "prompt_logprobs": None, "echo": True,
                                                       "logprobs": 2}).json()["choices"][0]["logprobs"]
    assert echo["token_logprobs"][0] is None
    # each within fidelity.py's bound of transformers' float64 logprob of the prompt token
    ref = _prompt_logprob_reference(prompt)
    ref.check(torch.tensor([first[q][str(prompt[q])]["logprob"] for q in range(1, len(prompt))]), "first")
    ref.check(torch.tensor([again[q][str(prompt[q])]["logprob"] for q in range(1, len(prompt))]), "again")
    ref.check(torch.tensor(echo["token_logprobs"][1:len(prompt)]), "echo")
    r = hybrid_server.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt_logprobs"


def test_cache_salt_separates_cached_prefixes(hybrid_server):
    client = hybrid_server.client()
    prompt = _ids(11, 140)
    def cached(salt):
        extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt else {})
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, extra_body=extra)
        return out.usage.prompt_tokens_details.cached_tokens
    assert cached("salt-one") == 0
    assert cached("salt-one") >= 128
    assert cached("salt-two") == 0
    assert cached(None) == 0


def test_priority_reaches_the_branches(hybrid_server):
    body = {"model": MODEL, "prompt": "p", "max_tokens": 400, "ignore_eos": True, "stream": True, "priority": -3,
            "request_id": "prio"}
    # its first round runs, then the engine holds it: it is still in flight when its branches are read
    with hybrid_server.held(rounds=1) as held, httpx.stream("POST", hybrid_server.url + "/v1/completions",
                                                           json=body, timeout=60):
        assert held.wait(60)
        prios = hybrid_server.loop.call(lambda eng: [b.priority for b in eng.requests["cmpl-prio"].branches])
        assert prios.result(timeout=30) == [-3]
    hybrid_server.wait_idle()


def test_request_id_and_return_token_ids(hybrid_server):
    r = hybrid_server.post("/v1/completions", json={"model": MODEL, "prompt": "hey", "max_tokens": 2,
                                                    "request_id": "mine-1", "return_token_ids": True,
                                                    "ignore_eos": True}).json()
    assert r["id"] == "cmpl-mine-1"
    assert r["choices"][0]["prompt_token_ids"] == list(b"hey") and len(r["choices"][0]["token_ids"]) == 2


# ------------------------------------------------------------------------------------------- chat
def test_chat_template_parameters(hybrid_server):
    msgs = [{"role": "user", "content": "hi"}]
    base = {"model": MODEL, "max_tokens": 1, "return_prompt_text": True, "temperature": 0}
    r = hybrid_server.post("/v1/chat/completions", json={**base, "messages": msgs}).json()
    assert r["prompt_text"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    r = hybrid_server.post("/v1/chat/completions", json={**base, "messages": msgs,
                                                         "add_generation_prompt": False}).json()
    assert r["prompt_text"] == "<|im_start|>user\nhi<|im_end|>\n"
    cont = msgs + [{"role": "assistant", "content": "The answer is"}]
    r = hybrid_server.post("/v1/chat/completions", json={**base, "messages": cont, "add_generation_prompt": False,
                                                         "continue_final_message": True, "echo": True}).json()
    assert r["prompt_text"].endswith("<|im_start|>assistant\nThe answer is")
    assert r["choices"][0]["message"]["content"].startswith("The answer is")
    r = hybrid_server.post("/v1/chat/completions", json={
        **base, "messages": msgs, "chat_template": "{{ greeting }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "chat_template_kwargs": {"greeting": "Hello, "}}).json()
    assert r["prompt_text"] == "Hello, hi"
    r = hybrid_server.post("/v1/chat/completions", json={**base, "messages": cont, "continue_final_message": True})
    assert r.status_code == 400 and error_of(r)["param"] == "continue_final_message"


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_message_without_content_is_refused(hybrid_server, role):
    r = hybrid_server.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": role}]})
    assert r.status_code == 400 and "needs content" in error_of(r)["message"]
    r = hybrid_server.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": role,
                                                                                        "content": None}]})
    assert r.status_code == 400


# ------------------------------------------------------------------------------------- nulls, refusals
NULLABLE = ["temperature", "top_p", "n", "stream", "max_tokens", "logprobs", "stop", "seed", "top_k",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p", "user",
            "stream_options", "response_format", "suffix", "best_of", "min_tokens", "stop_token_ids"]


def test_nulls_mean_defaults(hybrid_server):
    client = hybrid_server.client()
    nulls = {k: None for k in NULLABLE}
    plain = client.completions.create(model=MODEL, prompt="null test", seed=9, extra_body={"ignore_eos": True})
    out = hybrid_server.post("/v1/completions", json={"model": MODEL, "prompt": "null test", "echo": None,
                                                      "ignore_eos": True, **nulls, "seed": 9})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["choices"][0]["text"] == plain.choices[0].text and body["usage"]["completion_tokens"] == 16
    via_client = client.completions.create(model=MODEL, prompt="null test", seed=9, temperature=None, top_p=None,
                                           n=None, max_tokens=None, echo=None, logprobs=None, stream=None,
                                           stop=None, presence_penalty=None, extra_body={"ignore_eos": True})
    assert via_client.choices[0].text == plain.choices[0].text
    chat_nulls = {k: None for k in NULLABLE if k not in ("suffix", "best_of", "logprobs")}
    r = hybrid_server.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], **chat_nulls, "logprobs": None,
        "top_logprobs": None, "max_completion_tokens": None, "tools": None, "tool_choice": None})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"] is None


REFUSED = [
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "tool_choice", "required"),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),
    ("/v1/chat/completions", "reasoning_effort", "high"),
    ("/v1/chat/completions", "mm_processor_kwargs", {}),
    ("/v1/completions", "best_of", 3),
    ("/v1/completions", "suffix", "tail"),
    ("/v1/completions", "use_beam_search", True),
    ("/v1/completions", "length_penalty", 0.5),
    ("/v1/completions", "prompt_embeds", "AAAA"),
    ("/v1/completions", "kv_transfer_params", {}),
    ("/v1/completions", "vllm_xargs", {"a": 1}),
    ("/v1/completions", "thinking_token_budget", 10),
    ("/v1/completions", "stream_interval", 4),
    ("/v1/completions", "spaces_between_special_tokens", False),
    ("/v1/completions", "watermarking", True),
    ("/v1/completions", "logprob_token_ids", [1]),  # needs logprobs
    ("/v1/completions", "response_format", {"type": "structural_tag", "format": {}}),
    ("/v1/completions", "frobnicate", 1),  # unknown fields are refused too
    ("/v1/chat/completions", "modalities", ["text", "audio"]),
]


@pytest.mark.parametrize("endpoint, field, value", REFUSED)
def test_unsupported_fields_are_refused_naming_them(hybrid_server, endpoint, field, value):
    body = {"model": MODEL, "max_tokens": 1, field: value}
    body |= {"prompt": "x"} if endpoint == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    r = hybrid_server.post(endpoint, json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["param"] == field and field in err["message"] and "not supported" in err["message"]


@pytest.mark.parametrize("field, value, param", [
    ("logit_bias", {"999": 1}, "logit_bias"),
    ("logit_bias", {"a": 1}, "logit_bias"),
    ("allowed_token_ids", [600], "allowed_token_ids"),
    ("min_tokens", 50, "min_tokens"),
    ("cache_salt", "", "cache_salt"),
    ("truncate_prompt_tokens", -2, "truncate_prompt_tokens"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("guided_regex", "(open", "guided_regex"),
    ("guided_json", "{oops", "guided_json"),
])
def test_bad_values_are_400s_naming_the_field(hybrid_server, field, value, param):
    r = hybrid_server.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4, field: value})
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param


def test_fields_that_need_another_field(hybrid_server):
    msgs = [{"role": "user", "content": "x"}]
    r = hybrid_server.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "top_logprobs": 3})
    assert r.status_code == 400 and error_of(r)["param"] == "top_logprobs"
    r = hybrid_server.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                    "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and error_of(r)["param"] == "stream_options"
    r = hybrid_server.post("/v1/completions", json={"model": MODEL, "prompt": "x", "namespace": "a\u0000b"})
    assert r.status_code == 400 and error_of(r)["param"] == "namespace"


def test_streamed_echo_carries_prompt_logprobs_and_stop_reason(hybrid_server):
    client = hybrid_server.client()
    prompt = _ids(12, 12)
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=1,
                                     stop=["AA"], logit_bias={"65": 100})
    chunks = [c for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                                   echo=True, logprobs=1, stop=["AA"], logit_bias={"65": 100},
                                                   stream=True) if c.choices]
    lps = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert lps[0] is None and all(v is not None for v in lps[1:])
    ref = _prompt_logprob_reference(prompt)  # the prompt's logprobs: raw logits, no logit_bias
    ref.check(torch.tensor(full.choices[0].logprobs.token_logprobs[1:len(prompt)]), "echo")
    ref.check(torch.tensor(lps[1:len(prompt)]), "streamed echo")
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra["stop_reason"] == "AA"
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_streamed_token_ids_cover_the_whole_output(hybrid_server):
    client = hybrid_server.client()
    chunks = [c for c in client.completions.create(model=MODEL, prompt="hey", max_tokens=5, stream=True, seed=1,
                                                   extra_body={"return_token_ids": True, "ignore_eos": True})
              if c.choices]
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == list(b"hey")
    ids = [t for c in chunks for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert len(ids) == 5
