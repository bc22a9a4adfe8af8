"""JSONL trace files (SPEC §10): one branch per line, with `tokens` or `segments`."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixflow.core.branch import Branch

REQUIRED = ("request_id", "branch", "arrival", "namespace", "max_new_tokens")
SEGMENT_VOCAB = 32000


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the line and the problem."""


@dataclass(frozen=True)
class Segment:
    id: str
    len: int


def segment_tokens(seg_id: str, length: int, vocab: int = SEGMENT_VOCAB) -> tuple[int, ...]:
    """Deterministic tokens for a segment id: equal ids give equal tokens, so they share a prefix."""
    rng = np.random.default_rng(zlib.crc32(seg_id.encode()))
    return tuple(rng.integers(0, vocab, length).tolist())


_SEG_CACHE: dict[tuple[str, int, int], tuple[int, ...]] = {}


def tokens_of(segments, vocab: int = SEGMENT_VOCAB) -> tuple[int, ...]:
    out: list[int] = []
    for s in segments:
        key = (s.id, s.len, vocab)
        toks = _SEG_CACHE.get(key)
        if toks is None:
            toks = _SEG_CACHE[key] = segment_tokens(s.id, s.len, vocab)
        out.extend(toks)
    return tuple(out)


def branch_from_record(rec: dict, where: str = "trace", vocab: int = SEGMENT_VOCAB) -> Branch:
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: expected a JSON object")
    for k in REQUIRED:
        if k not in rec:
            raise TraceError(f"{where}: missing field {k!r}")
    if ("tokens" in rec) == ("segments" in rec):
        raise TraceError(f"{where}: give exactly one of 'tokens' or 'segments'")
    arrival = rec["arrival"]
    if not isinstance(arrival, (int, float)) or arrival < 0:
        raise TraceError(f"{where}: 'arrival' must be a number >= 0, got {arrival!r}")
    mnt = rec["max_new_tokens"]
    if not isinstance(mnt, int) or mnt < 1:
        raise TraceError(f"{where}: 'max_new_tokens' must be an integer >= 1, got {mnt!r}")
    if not isinstance(rec["branch"], int) or rec["branch"] < 0:
        raise TraceError(f"{where}: 'branch' must be an integer >= 0, got {rec['branch']!r}")
    if "tokens" in rec:
        toks = rec["tokens"]
        if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and t >= 0 for t in toks):
            raise TraceError(f"{where}: 'tokens' must be a non-empty list of non-negative integers")
        tokens = tuple(toks)
    else:
        segs = rec["segments"]
        if not isinstance(segs, list) or not segs:
            raise TraceError(f"{where}: 'segments' must be a non-empty list")
        parsed = []
        for s in segs:
            if not isinstance(s, dict) or "id" not in s or "len" not in s:
                raise TraceError(f"{where}: each segment needs 'id' and 'len'")
            if not isinstance(s["len"], int) or s["len"] < 0:
                raise TraceError(f"{where}: segment {s['id']!r} has a negative or non-integer length "
                                 f"{s['len']!r}")
            parsed.append(Segment(str(s["id"]), s["len"]))
        tokens = tokens_of(parsed, vocab)
        if not tokens:
            raise TraceError(f"{where}: the segments add up to an empty prompt")
    priority = rec.get("priority", 0)  # optional: lower runs first (vLLM's convention)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TraceError(f"{where}: 'priority' must be an integer, got {priority!r}")
    return Branch(str(rec["request_id"]), rec["branch"], tokens, namespace=str(rec["namespace"]),
                  arrival=float(arrival), max_new_tokens=mnt, priority=priority)


def read_jsonl(path: Path, error: type[ValueError] = ValueError):
    """(line number, record) for every non-blank line; `error` names the file and line of bad JSON."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{n}: not valid JSON ({e.msg})") from None


def load_trace(path: str | Path, vocab: int = SEGMENT_VOCAB) -> list[Branch]:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    out = [branch_from_record(rec, f"{path}:{n}", vocab) for n, rec in read_jsonl(path, TraceError)]
    if not out:
        raise TraceError(f"{path}: no branches")
    seen = set()
    for b in out:
        if b.key in seen:
            raise TraceError(f"{path}: branch {b.key} appears twice")
        seen.add(b.key)
    return out


def write_trace(path: str | Path, records: list[dict]) -> None:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))


def fresh_copies(branches: list[Branch]) -> list[Branch]:
    """New, unscheduled branches with the same inputs (each arm needs its own)."""
    return [Branch(b.request_id, b.index, b.prompt, b.namespace, b.arrival, b.max_new_tokens,
                   b.stop_token_ids, priority=b.priority) for b in branches]
