"""Bounded load on loopback: 64 concurrent clients mixing chat turns and 4-candidate scoring.

Every request must succeed; afterwards the pools are consistent and nothing but the cache itself
holds pages or snapshots.
"""

from __future__ import annotations

import asyncio
import random
import time

CLIENTS = 64
DOCS = 8
SYSTEM = "You are the radixflow load-test assistant. Answer in one short line, and never apologise."


async def _client(client, i: int, docs: list[list[int]]) -> list[str]:
    """Chat turn 1, 4-candidate scoring, chat turn 2 (history resent): returns problems found."""
    problems = []
    rng = random.Random(i)
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Client {i}: first question?"}]
    turn1 = await client.chat.completions.create(model="tiny-qwen3.5", messages=history, max_tokens=3,
                                                 temperature=0.7, seed=i, extra_body={"ignore_eos": True})
    if turn1.usage.completion_tokens != 3:
        problems.append(f"client {i} turn 1: {turn1.usage}")
    doc = docs[i % DOCS]
    candidates = [doc + [rng.randrange(256) for _ in range(5)] for _ in range(4)]
    score = await client.completions.create(model="tiny-qwen3.5", prompt=candidates, max_tokens=1, temperature=0,
                                            logprobs=5, extra_body={"namespace": "load-docs"})
    if len(score.choices) != 4 or any(len(c.logprobs.top_logprobs[0]) != 5 for c in score.choices):
        problems.append(f"client {i} scoring: {score.choices}")
    history += [{"role": "assistant", "content": turn1.choices[0].message.content},
                {"role": "user", "content": f"Client {i}: and a follow-up?"}]
    turn2 = await client.chat.completions.create(model="tiny-qwen3.5", messages=history, max_tokens=3,
                                                 temperature=0, extra_body={"ignore_eos": True})
    if turn2.usage.completion_tokens != 3 or turn2.usage.prompt_tokens <= turn1.usage.prompt_tokens:
        problems.append(f"client {i} turn 2: {turn2.usage}")
    return problems


async def _run_all(live) -> list[str]:
    rng = random.Random(0)
    docs = [[rng.randrange(256) for _ in range(72)] for _ in range(DOCS)]
    client = live.async_client(timeout=170)
    try:
        results = await asyncio.gather(*[_client(client, i, docs) for i in range(CLIENTS)])
    finally:
        await client.close()
    return [p for r in results for p in r]


def test_64_concurrent_clients(hybrid_server):
    t0 = time.perf_counter()
    problems = asyncio.run(_run_all(hybrid_server))
    elapsed = time.perf_counter() - t0
    assert not problems, problems[:5]
    report = hybrid_server.wait_idle()
    print(f"\nload test: {CLIENTS} clients x 3 requests in {elapsed:.1f} s; {report}")
    assert report["integrity"] == "ok"
    assert report["holds_nothing"], report
    assert report["held"] == report["waiting"] == report["running"] == 0


def test_scheduler_history_is_trimmed(hybrid_server, monkeypatch):
    from radixflow.server import engine_loop

    monkeypatch.setattr(engine_loop, "_KEEP", 2)
    client = hybrid_server.client()
    for i in range(3):
        client.completions.create(model="tiny-qwen3.5", prompt=f"trim {i}", max_tokens=2)
    sizes = hybrid_server.state.loop.call(lambda e: (len(e.scheduler.finished), len(e.scheduler.rounds)))
    finished, rounds = sizes.result(timeout=30)
    assert finished <= 3 and rounds <= 3
    assert hybrid_server.cache()["rounds"] > 3  # the round counter itself keeps counting
