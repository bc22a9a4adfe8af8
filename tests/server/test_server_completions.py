"""/v1/completions through the official openai client: text, token ids, logprobs, echo, stop, and
candidate lists (one logical request, one branch per prompt, sharing the cached document)."""

from __future__ import annotations

import random

import httpx
import torch
from server_harness import metric, scrape
from transformers import AutoModelForCausalLM

from fidelity import reference
from radixflow.engine.tiny import resolve_model


def test_models_and_health(hybrid_server):
    client = hybrid_server.client()
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny-qwen3.5"]
    r = httpx.get(hybrid_server.url + "/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_text_completion_greedy_is_deterministic(hybrid_server):
    client = hybrid_server.client()
    kw = dict(model="tiny-qwen3.5", prompt="The quick brown fox", max_tokens=6, temperature=0,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason == "length"
    assert a.usage.prompt_tokens == len(b"The quick brown fox")
    assert a.usage.completion_tokens == 6
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    # Hybrid: no snapshot lies below --state-interval 64, but `a` left an end-of-branch snapshot at the
    # last page boundary it passed (19 + 6 - 1 = 24 computed tokens -> 16), and `b` resumes from it.
    assert b.usage.prompt_tokens_details.cached_tokens == 16
    assert a.id.startswith("cmpl-") and a.object == "text_completion"


def test_token_id_prompt_and_logprobs(hybrid_server):
    client = hybrid_server.client()
    ids = [random.Random(1).randrange(256) for _ in range(40)]
    out = client.completions.create(model="tiny-qwen3.5", prompt=ids, max_tokens=3, temperature=0, logprobs=4,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3
    assert all(len(t) == 4 for t in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert abs(chosen - max(top.values())) < 1e-5
    assert out.usage.prompt_tokens == 40


def test_candidate_list_is_one_request_sharing_the_document(hybrid_server):
    client = hybrid_server.client()
    rng = random.Random(7)
    doc = [rng.randrange(256) for _ in range(200)]
    candidates = [doc + [rng.randrange(256) for _ in range(8)] for _ in range(4)]
    ns = {"namespace": "candidates-test"}
    out = client.completions.create(model="tiny-qwen3.5", prompt=candidates, max_tokens=1, temperature=0,
                                    logprobs=5, extra_body=ns)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(len(c.logprobs.top_logprobs[0]) == 5 for c in out.choices)
    assert out.usage.prompt_tokens == 4 * 208 and out.usage.completion_tokens == 4
    # Branch 0 produces the document's snapshot at 192 (3 * --state-interval); the other three are
    # Blocked on it in that round, deferred, and start from it one round later.
    assert out.usage.prompt_tokens_details.cached_tokens == 3 * 192
    # Same question again: every branch now starts from the cached document (snapshot at 192 = 3 * 64).
    again = client.completions.create(model="tiny-qwen3.5", prompt=candidates, max_tokens=1, temperature=0,
                                      logprobs=5, extra_body=ns)
    assert again.usage.prompt_tokens_details.cached_tokens >= 4 * 192
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-qwen3.5"), dtype=torch.float32).eval()
    for prompt, a, b in zip(candidates, out.choices, again.choices):
        assert a.logprobs.tokens == b.logprobs.tokens
        ref = reference(hf, prompt).log_softmax()[-1].top()  # greedy: the top logprob (fidelity.py)
        ref.check(torch.tensor(a.logprobs.token_logprobs[:1]), "first ask")
        ref.check(torch.tensor(b.logprobs.token_logprobs[:1]), "asked again (cache hit)")
    report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"]


def test_list_of_strings_and_n(hybrid_server):
    client = hybrid_server.client()
    out = client.completions.create(model="tiny-qwen3.5", prompt=["abc", "abd"], max_tokens=2, n=2,
                                    temperature=0.8, seed=3, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 8


def test_echo_and_stop(hybrid_server):
    client = hybrid_server.client()
    plain = client.completions.create(model="tiny-qwen3.5", prompt="hello", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    echoed = client.completions.create(model="tiny-qwen3.5", prompt="hello", max_tokens=8, temperature=0,
                                       echo=True, extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == "hello" + plain.choices[0].text
    text = plain.choices[0].text
    stop = next((ch for ch in text[1:] if ch != "\ufffd"), None)
    if stop is not None:
        cut = client.completions.create(model="tiny-qwen3.5", prompt="hello", max_tokens=8, temperature=0,
                                        stop=[stop], extra_body={"ignore_eos": True})
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == text[: text.index(stop)]


def test_streaming_completion_matches_non_streaming(hybrid_server):
    client = hybrid_server.client()
    kw = dict(model="tiny-qwen3.5", prompt="stream me", max_tokens=8, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_metrics_report_rounds_and_reuse(hybrid_server):
    samples = scrape(hybrid_server.url)
    assert all(("model_name", "tiny-qwen3.5") in labels for _, labels in samples)
    for name in ("radixflow_round_rows_bucket", "radixflow_round_tokens_bucket", "radixflow_reuse_rate",
                 "radixflow_blocked_deferrals_total", "radixflow_request_latency_seconds_bucket",
                 "radixflow_time_to_first_token_seconds_bucket", "radixflow_time_per_output_token_seconds_bucket",
                 "radixflow_inter_token_latency_seconds_bucket", "radixflow_event_loop_lag_seconds_bucket"):
        assert any(n == name for n, _ in samples), name
    metric(samples, "radixflow_queue_length", state="waiting")
    for kind in ("held", "cached", "free", "total"):
        metric(samples, "radixflow_kv_pages", kind=kind)
        metric(samples, "radixflow_state_slots", kind=kind)
    assert metric(samples, "radixflow_rounds_total") > 0
