"""Misses by cause (SPEC §14): why a branch recomputed the prompt tokens it did.

At a branch's first selection its prompt splits into four parts that add up:

    prompt = ready hit h + checkpoint missing + evicted + no shared prefix

- ready hit h: the start it resumed from (a published state boundary on hybrid models);
- checkpoint missing: ĥ − h that no eviction explains (the index holds the KV, no snapshot there);
- evicted: a path or a snapshot that was cached and was reclaimed (seen through the index's ghosts):
  the part of ĥ − h below an evicted snapshot, plus evicted KV pages past ĥ;
- no shared prefix: the rest past ĥ (nothing cached ever held it; the last token always runs).

Blocked is counted apart: the rounds a branch was deferred behind a same-round producer and the
tokens its wait saved (the blocking snapshot's depth minus the ready boundary under it at the first
deferral). A deferral costs rounds, not tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

CAUSES = ("ready_hit", "checkpoint_missing", "evicted", "no_shared_prefix")


@dataclass(slots=True)
class Misses:
    prompt: int = 0
    identity_hit: int = 0  # ĥ
    ready_hit: int = 0  # h
    checkpoint_missing: int = 0
    evicted: int = 0
    no_shared_prefix: int = 0
    blocked_rounds: int = 0
    blocked_tokens: int = 0

    def add(self, other: Misses) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def at_first_selection(index, namespace: str, tokens, hashes: list[int], prompt: int, identity: int,
                       ready: int, blocked: tuple[int, int] = (0, 0)) -> Misses:
    """Splits `prompt` by cause for a branch that matched `identity` (ĥ) and starts at `ready` (h)."""
    ghosts = index.ghosts
    if not len(ghosts):  # nothing was ever evicted (or remembered): no part of the prompt is "evicted"
        return Misses(prompt, identity, ready, identity - ready, 0, prompt - identity, blocked[0], blocked[1])
    bs = index.block_size
    gone_state = ready
    for i in range(identity // bs, ready // bs - 1, -1):  # deepest evicted snapshot in (h, ĥ]
        anchor = hashes[i - 1] if i else ("root", namespace)
        for depth, tail_hash in ghosts.snapshots_at(anchor):
            if gone_state < depth <= identity and hash(tuple(tokens[i * bs : depth])) == tail_hash:
                gone_state = depth
        if gone_state > ready:
            break
    page = identity // bs  # evicted KV pages right past the match
    while page < len(hashes) and ghosts.page(hashes[page]):
        page += 1
    gone_kv = max(0, min(page * bs, prompt - 1) - identity)
    return Misses(prompt=prompt, identity_hit=identity, ready_hit=ready,
                  checkpoint_missing=identity - gone_state, evicted=(gone_state - ready) + gone_kv,
                  no_shared_prefix=prompt - identity - gone_kv, blocked_rounds=blocked[0],
                  blocked_tokens=blocked[1])


def total(branches) -> Misses:
    out = Misses()
    for b in branches:
        if b.misses is not None:
            out.add(b.misses)
    return out
