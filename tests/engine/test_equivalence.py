"""Our batched paged forward against transformers' own forward on the same weights: within
fidelity.py's bound of the float64 truth (a multiple of transformers' own fp32 error)."""

from __future__ import annotations

import pytest
import torch

from fidelity import concat, reference
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput

BLOCK = 16


@pytest.fixture(scope="module")
def pair(family):
    name, directory, hf = family
    return name, load_model(directory).model, hf


def tokens(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pages(first: int, n_tokens: int) -> list[int]:
    return list(range(first, first + -(-n_tokens // BLOCK)))


def row(ids, start, table, state_in=None, state_out=(), logits=True):
    n = len(ids)
    return RowInput(list(ids), start, table, state_in, list(state_out), list(range(n)) if logits else [])


def test_whole_prompt(pair):
    _, model, hf = pair
    ids = tokens(150)
    cache = model.allocate_cache(32, BLOCK, 4)
    out = model([row(ids, 0, pages(0, 150))], cache)
    reference(hf, ids).check(out, "whole prompt")


def test_resume_from_snapshot(pair):
    _, model, hf = pair
    ids, cut = tokens(120, seed=2), 48
    cache = model.allocate_cache(32, BLOCK, 4)
    table = pages(0, 120)
    model([row(ids[:cut], 0, table, None, [(cut, 1)], logits=False)], cache)
    out = model([row(ids[cut:], cut, table, 1 if model.is_hybrid else None, [])], cache)
    reference(hf, ids)[cut:].check(out, "resumed")


@pytest.mark.parametrize("chunk", [16, 32, 48, 80])
def test_chunked_prefill(pair, chunk):
    _, model, hf = pair
    ids = tokens(200, seed=3)
    cache = model.allocate_cache(32, BLOCK, 4)
    table, outs, slot = pages(0, 200), [], None
    for lo in range(0, 200, chunk):
        piece = ids[lo:lo + chunk]
        nxt = 1 if slot != 1 else 2  # alternate slots: never write the slot being read
        outs.append(model([row(piece, lo, table, slot, [(len(piece), nxt)])], cache))
        slot = nxt if model.is_hybrid else None
    reference(hf, ids).check(torch.cat(outs), f"chunks of {chunk}")


def test_mixed_batch_with_same_round_sharing(pair):
    """One call: a producer rewriting shared prefix pages, a consumer reading them, a decode row,
    and a row with a mid-prompt snapshot; every row checked against its own full sequence."""
    _, model, hf = pair
    hybrid = model.is_hybrid
    prefix, tail_a, tail_b = tokens(64, 4), tokens(40, 5), tokens(23, 6)
    other = tokens(90, 7)
    cache = model.allocate_cache(64, BLOCK, 8)
    # round 1: state after 32 prefix tokens into slot 0; the decode row's sequence into slot 3
    model([row(prefix[:32], 0, pages(0, 32), None, [(32, 0)], False),
           row(other[:89], 0, pages(40, 89), None, [(89, 3)], False)], cache)
    for t in (*cache.k, *cache.v):
        t[:2].zero_()  # the prefix pages must be rewritten in round 2 before the consumer reads them
    shared = pages(0, 32)
    producer = row(prefix + tail_a, 0, shared + pages(10, 72), None, [(64, 1), (104, 2)])
    consumer = row(prefix[32:] + tail_b, 32, shared + pages(20, 55), 0 if hybrid else None, [(55, 0)])
    decode = row(other[89:], 89, pages(40, 90), 3 if hybrid else None, [(1, 4)])
    out = model([producer, consumer, decode], cache)
    want = concat([reference(hf, prefix + tail_a), reference(hf, prefix + tail_b)[32:],
                   reference(hf, other)[89:]])
    want.check(out, "producer, consumer and decode rows")
    # slot 0 was the consumer's input AND output: it now holds the state after 87 tokens
    nxt = tokens(1, 10)
    table = shared + pages(20, 56)
    out = model([row(nxt, 87, table, 0 if hybrid else None, [])], cache)
    reference(hf, prefix + tail_b + nxt)[87:].check(out, "after in-and-out slot")


def test_greedy_decode_20_steps(pair):
    _, model, hf = pair
    hybrid = model.is_hybrid
    prompts = [tokens(37, 8), tokens(70, 9)]
    cache = model.allocate_cache(64, BLOCK, 8)
    tables = [pages(0, 100), pages(20, 100)]
    seqs = [list(p) for p in prompts]
    rows = [row(p, 0, t, None, [(len(p), 2 * i)], logits=False)
            for i, (p, t) in enumerate(zip(prompts, tables))]
    for r in rows:
        r.logits_at = [len(r.token_ids) - 1]
    slots = [0, 2]
    logits = model(rows, cache)
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(20):
        nxt = logits.argmax(-1).tolist()
        rows = []
        for i in range(2):
            seqs[i].append(nxt[i])
            out_slot = slots[i] ^ 1  # ping-pong between two slots per sequence
            rows.append(RowInput([nxt[i]], len(seqs[i]) - 1, tables[i], slots[i] if hybrid else None,
                                 [(1, out_slot)], [0]))
            slots[i] = out_slot
        logits = model(rows, cache)
        for i in range(2):
            got[i].append(logits[i])
    for i in range(2):
        reference(hf, seqs[i])[len(prompts[i]):].check(torch.stack(got[i]), f"decode of sequence {i}")


def test_scan_in_small_blocks(pair, monkeypatch):
    """The CPU cache blocking of the chunk scans (one block per step here) changes no logits."""
    from radixflow.engine.models import chunk_plan

    _, model, hf = pair
    monkeypatch.setattr(chunk_plan, "_BLOCK_ELEMS", 1)
    a, b = tokens(300, 11), tokens(170, 12)
    cache = model.allocate_cache(64, BLOCK, 4)
    out = model([row(a, 0, pages(0, 300), None, [(130, 0)]), row(b, 0, pages(20, 170), None, [(170, 1)])],
                cache)
    concat([reference(hf, a), reference(hf, b)]).check(out, "small blocks")
    if model.is_hybrid:  # the snapshot taken mid-row in a later block resumes correctly
        resumed = model([row(a[130:], 130, pages(0, 300), 0, [])], cache)
        reference(hf, a)[130:].check(resumed, "resumed from a snapshot in a later block")
