"""Multi-turn chat: conversations, their two variants and the sessions built from them."""

from __future__ import annotations

import pytest

from radixflow.workloads.multiturn import VARIANTS, ChatSpec, chat_sessions, conversation

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
