"""Multi-turn chat replayed through the real scheduler: the chapter's per-turn numbers (SPEC §10)."""

from __future__ import annotations

import pytest

from radixflow.sim.chat_trace import trace_chat
from radixflow.workloads.multiturn import ChatSpec, conversation

CHAPTER = ChatSpec(system_len=200, user_len=80, assistant_len=150, turns=5)


def test_full_attention_trace_matches_the_chapter():
    rows = trace_chat(conversation(CHAPTER), "qwen3-8b")
    assert [r.request_len for r in rows] == [280, 510, 740, 970, 1200]
    assert [r.hit for r in rows] == [0, 430, 660, 890, 1120]
    assert [r.ready_hit for r in rows] == [0, 430, 660, 890, 1120]
    assert [r.recomputed for r in rows] == [280, 80, 80, 80, 80]
    assert sum(r.recomputed for r in rows) == 600 and sum(r.request_len for r in rows) == 3700


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3.5-0.8b"])
def test_rewrite_turn2_still_hits_the_common_ancestor(model):
    rows = trace_chat(conversation(CHAPTER, 0, ("rewrite-turn2",)), model)
    rewrite = rows[-1]
    assert (rewrite.request_len, rewrite.hit) == (510, 430)
    # Turn 1 ended exactly there, so the hybrid model has its end-of-turn snapshot too.
    assert rewrite.ready_hit == 430 and rewrite.recomputed == 80


def test_new_user_shares_only_the_system_prompt():
    full = trace_chat(conversation(CHAPTER, 0, ("new-user",)), "qwen3-8b")[-1]
    assert (full.hit, full.ready_hit, full.recomputed) == (200, 200, 80)
    # Hybrid: no state boundary at 200 (snapshots every 512 tokens and at turn ends): a cold start.
    hybrid = trace_chat(conversation(CHAPTER, 0, ("new-user",)), "qwen3.5-0.8b")[-1]
    assert (hybrid.hit, hybrid.ready_hit, hybrid.recomputed) == (200, 0, 280)
    # Denser snapshots shrink the gap to the last boundary below 200.
    dense = trace_chat(conversation(CHAPTER, 0, ("new-user",)), "qwen3.5-0.8b", state_interval=64)[-1]
    assert (dense.hit, dense.ready_hit) == (200, 192)


def test_page_size_rounds_hits_down_to_pages():
    rows = trace_chat(conversation(CHAPTER), "qwen3-8b", block_size=16)
    assert [r.hit for r in rows] == [0, 416, 656, 880, 1120]
