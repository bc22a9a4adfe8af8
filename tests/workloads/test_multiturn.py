"""Multi-turn chat: the chapter's per-turn numbers and its two variants, through the real scheduler."""

from __future__ import annotations

import pytest

from radixflow.workloads.multiturn import VARIANTS, ChatSpec, chat_sessions, conversation, trace_chat

CHAPTER = ChatSpec(system_len=200, user_len=80, assistant_len=150, turns=5)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_conversation_lengths_and_sharing():
    turns = conversation(CHAPTER, 0, VARIANTS)
    assert [len(t.request) for t in turns] == [280, 510, 740, 970, 1200, 510, 280]
    for prev, nxt in zip(turns[:4], turns[1:5]):
        assert nxt.request[: len(prev.request) + 150] == prev.request + prev.answer
    rewrite, new_user = turns[5], turns[6]
    assert common_prefix(rewrite.request, turns[1].request) == 430
    assert common_prefix(new_user.request, turns[0].request) == 200


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="choose from"):
        conversation(CHAPTER, 0, ("edit",))


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


def test_chat_sessions_share_the_system_prompt_and_fork_rewrites():
    spec = ChatSpec(users=4, turns=3, rewrite_fraction=1.0, seed=1)
    sessions = chat_sessions(spec)
    assert len(sessions) == 8
    users = [s for s in sessions if not s.sid.endswith("rewrite")]
    assert all(s.tokens[:200] == users[0].tokens[:200] for s in sessions)
    assert [c.prompt_end for c in users[0].calls] == [280, 510, 740]
    fork = next(s for s in sessions if s.sid == "user0-rewrite")
    assert common_prefix(fork.tokens, users[0].tokens) == 430
    with pytest.raises(ValueError):
        ChatSpec(turns=0)
