"""SPEC §10 multi-turn chat through the server: system 200, user 80, assistant 150 tokens, history
resent every turn as a growing token-id prompt (request lengths 280, 510, 740, 970, 1200).

The assistant turns are the model's own 150 sampled tokens. The last sampled token of a turn is
never run through the model, so its KV does not exist: each hit is one token short of SPEC's
0, 430, 660, 890, 1120 on a full-attention model with --block-size 1.
"""

from __future__ import annotations

import random

SYSTEM, USER, ASSISTANT, TURNS = 200, 80, 150, 5


def converse(live, namespace: str) -> tuple[list[int], list[int]]:
    """Runs the five turns; returns (prompt lengths, cached tokens) per turn."""
    client = live.client(timeout=300)
    rng = random.Random(namespace)
    history = [rng.randrange(256) for _ in range(SYSTEM)]
    lengths, cached = [], []
    for _ in range(TURNS):
        history += [rng.randrange(256) for _ in range(USER)]
        out = client.completions.create(model=live.model, prompt=history, max_tokens=ASSISTANT, temperature=0,
                                        logprobs=0, extra_body={"ignore_eos": True, "namespace": namespace,
                                                                "return_tokens_as_token_ids": True})
        assert out.usage.completion_tokens == ASSISTANT
        lengths.append(out.usage.prompt_tokens)
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
        history += [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]
    return lengths, cached


def test_five_turns_full_attention_block_size_1(dense_server):
    lengths, cached = converse(dense_server, "multiturn-dense")
    assert lengths == [280, 510, 740, 970, 1200]
    assert cached == [0, 429, 659, 889, 1119]


def test_five_turns_hybrid(hybrid_server):
    """tiny-qwen3.5, --block-size 16, --state-interval 64: a hit needs a state snapshot; a finished turn
    leaves one at the last page boundary it passed (its end, 429 + 230k, is not page-aligned), so each
    hit rounds down to a multiple of 16: 0, 416, 656, 880, 1104."""
    lengths, cached = converse(hybrid_server, "multiturn-hybrid")
    assert lengths == [280, 510, 740, 970, 1200]
    assert cached == [0, 416, 656, 880, 1104]


def test_five_turns_hybrid_with_branch_checkpoints():
    """--checkpoints branch: each finished turn leaves a snapshot at its exact computed length, so the
    hybrid model gets the full-attention figures (one token short of SPEC's, as above)."""
    import re

    import httpx
    from server_harness import start_server

    live = start_server("tiny-qwen3.5", checkpoints="branch")
    try:
        lengths, cached = converse(live, "multiturn-branch")
        assert lengths == [280, 510, 740, 970, 1200]
        assert cached == [0, 429, 659, 889, 1119]
        body = httpx.get(live.url + "/metrics", timeout=10).text
        by_cause = {re.search(r'cause="([^"]+)"', line).group(1): float(line.split()[-1])
                    for line in body.splitlines() if line.startswith("radixflow_prompt_tokens_by_cause_total{")}
        assert by_cause["ready_hit"] == sum(cached)
        assert sum(by_cause.values()) == sum(lengths)
    finally:
        live.stop()
