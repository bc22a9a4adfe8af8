"""`radixflow serve` at its defaults beside llama.cpp's own HTTP server (`llama-server`), end to end over HTTP.

Both servers are started by this script on the same weights: the `random:` model's HF directory for ours,
its F32 GGUF for llama-server (benchmarks/llamacpp_convert.py, converted once and cached next to the model
directory). One client sends token-id prompts, one request at a time; each server runs on 2 threads.

By default (`--order interleaved`) the two are measured side by side: ours is started once per model and
left up, llama-server is started with each workload's settings beside it, and the workload's items go to
the two in turn, one by one (item i to ours then llama-server for even i, the other way for odd i). Only
one server is ever answering; the other is idle (ours finishes its lazy warm-up first, see `wait_warm`).
A server's time on a workload is then the sum of its items' latencies. These machines' memory rate moves
by a third from minute to minute, so one server after the other (`--order sequential`, the form of the
runs before stop 44) measures the minute as much as the server.

    python benchmarks/serve_peers.py --json out.json                  # both models, both servers
    python benchmarks/serve_peers.py --models random:qwen3.5-0.8b --scale 0.5
    python benchmarks/serve_peers.py --only radixflow --models tiny-qwen3.5   # no llama-server needed

llama-server comes from scripts/install_llamaserver.sh (built from the llama.cpp vendored in the
llama-cpp-python 0.3.36 sdist); `--llama-server PATH` points elsewhere.

Ours: `radixflow serve --model M --torch-threads 2 --host 127.0.0.1 --port P`, every other setting at its
default (from the sources this script sits in). Side by side, its lazy warm-up (first forward, probes) is
done before the first timed item (`wait_warm`; start-up is timed to /health 200 before it); one server after
the other (`--order sequential`), nothing is warmed up: the first request pays whatever start-up left for it.

Workloads (seeded; `--scale` multiplies the number of documents and sessions):
- scoring: 2 documents of 800-1,200 tokens, 4 questions each (12-40 tokens) x 4 candidates (2-12
  tokens), questions on the same document back to back; max_tokens 1, greedy, logprobs. Ours gets a
  question as ONE list-prompt request (one logical request, docs/server.md); llama-server gets the
  candidates one after another (`sequential`, its better form per its source: each candidate restores
  the slot's context checkpoint) or as one multi-prompt request on parallel slots (`--llama-scoring
  parallel`). An item is a question; its TTFT is from its first request sent to its last answer.
- agentic: 4 sessions, 4 turns each, interleaved (turn t of every session, then turn t+1): a first prompt
  of 400-600 tokens (system + task); each later turn appends the session's previous reply (the server's
  own 16 greedy tokens) and a tool output of 60-140 tokens. Streamed; an item is a turn, TTFT its first token.
- decode probe: 1 and 16 concurrent streams of 32 greedy tokens (16-token prompts); aggregate tokens/s
  = sum(tokens - 1) / (last token - first token of the probe).

Tokens computed vs cached come from each server's own counters: ours `usage.prompt_tokens_details
.cached_tokens` (computed = prompt_tokens - cached), llama-server `timings.prompt_n` / `timings.cache_n`.
Every scoring row's greedy token and every agentic reply's tokens are compared (a session's later turns are
compared only while its replies agree: after a difference the two histories differ).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = ("random:qwen3.5-0.8b", "random:nemotron-h-1b")
THREADS = 2
INSTALL = "scripts/install_llamaserver.sh"


# ============================================================================ workloads
@dataclass(frozen=True)
class Sizes:
    """The workloads' shapes at `--scale 1` (token lengths are inclusive ranges)."""
    docs: int = 2
    questions_per_doc: int = 4
    candidates: int = 4
    doc_len: tuple[int, int] = (800, 1200)
    question_len: tuple[int, int] = (12, 40)
    candidate_len: tuple[int, int] = (2, 12)
    sessions: int = 4
    turns: int = 4
    first_len: tuple[int, int] = (400, 600)
    tool_len: tuple[int, int] = (60, 140)
    reply_tokens: int = 16
    probe_prompt: int = 16
    probe_tokens: int = 32
    probe_streams: tuple[int, ...] = (1, 16)

    def scaled(self, scale: float, lengths: float = 1.0) -> Sizes:
        """`scale` multiplies documents and sessions (at least one each); `lengths` every token length
        but the replies' (tests use it to run small)."""
        if scale <= 0 or lengths <= 0:
            raise ValueError("--scale and --length-scale must be positive")

        def ln(r: tuple[int, int]) -> tuple[int, int]:
            return max(1, round(r[0] * lengths)), max(1, round(r[1] * lengths))

        return Sizes(docs=max(1, round(self.docs * scale)), questions_per_doc=self.questions_per_doc,
                     candidates=self.candidates, doc_len=ln(self.doc_len), question_len=ln(self.question_len),
                     candidate_len=ln(self.candidate_len), sessions=max(1, round(self.sessions * scale)),
                     turns=self.turns, first_len=ln(self.first_len), tool_len=ln(self.tool_len),
                     reply_tokens=self.reply_tokens, probe_prompt=self.probe_prompt,
                     probe_tokens=self.probe_tokens, probe_streams=self.probe_streams)


@dataclass(frozen=True)
class Question:
    doc: int
    doc_len: int
    shared: int                            # document + question: what the candidates share
    prompts: tuple[tuple[int, ...], ...]   # document + question + candidate k, one per candidate


@dataclass(frozen=True)
class Session:
    first: tuple[int, ...]                 # system + task: the first turn's prompt
    tools: tuple[tuple[int, ...], ...]     # the tool output appended before turn t + 1 (turns - 1 of them)


def _ids(rng: random.Random, span: tuple[int, int]) -> tuple[int, ...]:
    """Byte-token ids (0-255: ids every random and tiny model's tokenizer produces)."""
    return tuple(rng.randrange(256) for _ in range(rng.randint(*span)))


def scoring_workload(sizes: Sizes, seed: int) -> list[Question]:
    rng = random.Random(f"scoring-{seed}")
    out = []
    for d in range(sizes.docs):
        doc = _ids(rng, sizes.doc_len)
        for _ in range(sizes.questions_per_doc):
            q = _ids(rng, sizes.question_len)
            prompts = tuple(doc + q + _ids(rng, sizes.candidate_len) for _ in range(sizes.candidates))
            out.append(Question(d, len(doc), len(doc) + len(q), prompts))
    return out


def agentic_workload(sizes: Sizes, seed: int) -> list[Session]:
    rng = random.Random(f"agentic-{seed}")
    return [Session(_ids(rng, sizes.first_len), tuple(_ids(rng, sizes.tool_len) for _ in range(sizes.turns - 1)))
            for _ in range(sizes.sessions)]


def probe_prompts(sizes: Sizes, seed: int, streams: int) -> list[tuple[int, ...]]:
    rng = random.Random(f"probe-{seed}-{streams}")
    return [_ids(rng, (sizes.probe_prompt, sizes.probe_prompt)) for _ in range(streams)]


# ============================================================================ results and summaries
@dataclass
class Row:
    """One sampled position: a scoring row's token, or one reply token of an agentic turn."""
    token: int
    logprob: float | None = None


@dataclass
class Item:
    """One question (scoring) or one turn (agentic) as a server answered it."""
    key: str
    ttft: float
    latency: float
    prompt_tokens: int
    computed: int
    cached: int
    rows: list[Row] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(items: list[Item], wall: float) -> dict:
    ttfts = [i.ttft for i in items]
    return {"items": len(items), "wall_s": wall, "items_per_s": len(items) / wall if wall > 0 else math.nan,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "prompt_tokens": sum(i.prompt_tokens for i in items), "computed": sum(i.computed for i in items),
            "cached": sum(i.cached for i in items)}


def compare_scoring(ours: list[Item], theirs: list[Item]) -> dict:
    """Same greedy token on every row of every question (rows in candidate order)."""
    rows = same = 0
    diffs, mismatches = [], []
    for a, b in zip(ours, theirs):
        for k, (ra, rb) in enumerate(zip(a.rows, b.rows)):
            rows += 1
            if ra.token == rb.token:
                same += 1
                if ra.logprob is not None and rb.logprob is not None:
                    diffs.append(abs(ra.logprob - rb.logprob))
            else:
                mismatches.append(f"{a.key}/{k}: {ra.token} vs {rb.token}")
    return {"rows": rows, "same": same, "max_abs_dlogprob": max(diffs) if diffs else None, "mismatches": mismatches}


def compare_agentic(ours: list[Item], theirs: list[Item]) -> dict:
    """Reply tokens position by position; a session's turns after its first differing reply are not
    compared (its two histories differ from then on). Items are keyed `s<session>/t<turn>`."""
    theirs_by = {i.key: i for i in theirs}
    diverged: set[str] = set()
    replies = same = tokens = same_tokens = 0
    mismatches = []
    for a in sorted(ours, key=lambda i: (int(i.key.split("/t")[1]), i.key)):
        session = a.key.split("/")[0]
        b = theirs_by.get(a.key)
        if b is None or session in diverged:
            continue
        replies += 1
        ta, tb = [r.token for r in a.rows], [r.token for r in b.rows]
        tokens += max(len(ta), len(tb))
        same_tokens += sum(x == y for x, y in zip(ta, tb))
        if ta == tb:
            same += 1
        else:
            diverged.add(session)
            first = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            mismatches.append(f"{a.key}: first difference at token {first}")
    return {"replies": replies, "same": same, "tokens": tokens, "same_tokens": same_tokens,
            "not_compared": len(ours) - replies, "mismatches": mismatches}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def ratios(ours: dict, llama: dict) -> dict:
    """ours / llama-server, each > 1 where ours is better except the TTFT and start-up ones (< 1 is better)."""
    out = {}
    for w in ("scoring", "agentic"):
        if w in ours and w in llama:
            out[f"{w}_throughput"] = ratio(ours[w]["items_per_s"], llama[w]["items_per_s"])
            out[f"{w}_ttft_p99"] = ratio(ours[w]["ttft_p99_s"], llama[w]["ttft_p99_s"])
    out["startup"] = ratio(ours.get("startup_s"), llama.get("startup_s"))
    for n in ("1", "16"):
        a, b = ours.get("decode", {}).get(n), llama.get("decode", {}).get(n)
        if a and b:
            out[f"decode_{n}"] = ratio(a["tok_s"], b["tok_s"])
    return out


def verdicts(r: dict, top1: dict, startup_s: float | None) -> dict[str, bool | None]:
    """The issue's Done-when items, from one model's ratios (None where not measured)."""
    def at_least(key: str, bound: float) -> bool | None:
        return None if r.get(key) is None else r[key] >= bound

    def at_most(key: str, bound: float) -> bool | None:
        return None if r.get(key) is None else r[key] <= bound

    s, a = top1.get("scoring"), top1.get("agentic")
    same = None
    if s is not None or a is not None:
        same = all(x["same"] == x.get("rows", x.get("replies")) for x in (s, a) if x is not None)
    return {"scoring >= 1.5x": at_least("scoring_throughput", 1.5),
            "agentic >= 1.0x": at_least("agentic_throughput", 1.0),
            "TTFT p99 scoring <= llama": at_most("scoring_ttft_p99", 1.0),
            "TTFT p99 agentic <= llama": at_most("agentic_ttft_p99", 1.0),
            "top-1 same on every compared row": same,
            "start-up <= 15 s": None if startup_s is None else startup_s <= 15.0}


# ============================================================================ HTTP
def post(url: str, body: dict, timeout: float) -> dict | list:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read()[:400].decode(errors='replace')}") from None


def post_sse(url: str, body: dict, timeout: float) -> Iterator[tuple[float, dict]]:
    """(arrival time, event) for each `data:` event of a server-sent-events response."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read()[:400].decode(errors='replace')}") from None
    with resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield time.perf_counter(), json.loads(data)


class Client:
    """What the benchmark asks of a server; one subclass per server's API."""
    name = ""

    def __init__(self, base: str, model: str, timeout: float):
        self.base, self.model, self.timeout = base, model, timeout

    def stream(self, prompt: tuple[int, ...], n: int) -> Item:
        raise NotImplementedError

    def score(self, q: Question, key: str) -> Item:
        raise NotImplementedError


class RadixflowClient(Client):
    """OpenAI /v1/completions with token-id prompts."""
    name = "radixflow"

    def _body(self, prompt, n: int) -> dict:
        return {"model": self.model, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1,
                "return_token_ids": True, "ignore_eos": True}

    @staticmethod
    def _usage(u: dict) -> tuple[int, int]:
        cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return int(u["prompt_tokens"]), cached

    def score(self, q: Question, key: str) -> Item:
        t0 = time.perf_counter()
        out = post(f"{self.base}/v1/completions", self._body([list(p) for p in q.prompts], 1), self.timeout)
        dt = time.perf_counter() - t0
        choices = sorted(out["choices"], key=lambda c: c["index"])
        rows = [Row(c["token_ids"][0], c["logprobs"]["token_logprobs"][0]) for c in choices]
        prompt, cached = self._usage(out["usage"])
        return Item(key, dt, dt, prompt, prompt - cached, cached, rows)

    def stream(self, prompt: tuple[int, ...], n: int, key: str = "") -> Item:
        body = {**self._body(list(prompt), n), "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first, rows, usage = None, [], None
        for t, ev in post_sse(f"{self.base}/v1/completions", body, self.timeout):
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                ids = c.get("token_ids") or []
                lps = (c.get("logprobs") or {}).get("token_logprobs") or [None] * len(ids)
                if ids and first is None:
                    first = t
                rows += [Row(i, lp) for i, lp in zip(ids, lps)]
                last = t
        if usage is None or first is None:
            raise RuntimeError(f"radixflow: a stream ended without tokens or usage ({key})")
        prompt_n, cached = self._usage(usage)
        item = Item(key, first - t0, last - t0, prompt_n, prompt_n - cached, cached, rows)
        item.first_at, item.last_at = first, last  # type: ignore[attr-defined]
        return item


class LlamaClient(Client):
    """llama-server's own /completion: token-id prompts, `cache_prompt`, `n_probs`, timings."""
    name = "llama-server"

    def __init__(self, base: str, model: str, timeout: float, scoring: str = "sequential"):
        super().__init__(base, model, timeout)
        self.scoring = scoring

    @staticmethod
    def _body(prompt, n: int) -> dict:
        return {"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 1, "cache_prompt": True,
                "return_tokens": True, "ignore_eos": True}

    @staticmethod
    def _one(out: dict) -> tuple[Row, int, int]:
        p = out["completion_probabilities"][0]
        t = out["timings"]
        return Row(int(p["id"]), float(p["logprob"])), int(t["prompt_n"]), int(t["cache_n"])

    def score(self, q: Question, key: str) -> Item:
        t0 = time.perf_counter()
        if self.scoring == "parallel":
            outs = post(f"{self.base}/completion", self._body([list(p) for p in q.prompts], 1), self.timeout)
            outs = sorted(outs, key=lambda o: o["index"])
        else:
            outs = [post(f"{self.base}/completion", self._body(list(p), 1), self.timeout) for p in q.prompts]
        dt = time.perf_counter() - t0
        parts = [self._one(o) for o in outs]
        computed, cached = sum(p[1] for p in parts), sum(p[2] for p in parts)
        return Item(key, dt, dt, computed + cached, computed, cached, [p[0] for p in parts])

    def stream(self, prompt: tuple[int, ...], n: int, key: str = "") -> Item:
        body = {**self._body(list(prompt), n), "stream": True}
        t0 = time.perf_counter()
        first, rows, timings = None, [], None
        for t, ev in post_sse(f"{self.base}/completion", body, self.timeout):
            ids = ev.get("tokens") or []
            probs = ev.get("completion_probabilities") or []
            lps = [p.get("logprob") for p in probs] if len(probs) == len(ids) else [None] * len(ids)
            if ids and first is None:
                first = t
            rows += [Row(int(i), lp) for i, lp in zip(ids, lps)]
            if ids:
                last = t
            if ev.get("timings"):
                timings = ev["timings"]
        if timings is None or first is None:
            raise RuntimeError(f"llama-server: a stream ended without tokens or timings ({key})")
        if int(timings.get("predicted_n", len(rows))) != len(rows):   # a token held back mid-character
            raise RuntimeError(f"llama-server: {timings['predicted_n']} tokens predicted, {len(rows)} streamed ({key})")
        computed, cached = int(timings["prompt_n"]), int(timings["cache_n"])
        item = Item(key, first - t0, last - t0, computed + cached, computed, cached, rows)
        item.first_at, item.last_at = first, last  # type: ignore[attr-defined]
        return item


# ============================================================================ running the workloads
def interleave(clients: list[Client], n: int, call) -> list[list[Item]]:
    """Item i of every client, item by item: `call(client, i)` for i < n, each item's clients in turn,
    the first of them alternating (0, 1, ... for even i, reversed for odd), so a drift in the machine's
    speed (these machines' memory rate moves minute to minute) falls on both servers alike."""
    out: list[list[Item]] = [[] for _ in clients]
    for i in range(n):
        order = range(len(clients)) if i % 2 == 0 else reversed(range(len(clients)))
        for c in order:
            out[c].append(call(clients[c], i))
    return out


def _summaries(per_client: list[list[Item]], wall: float) -> list[tuple[dict, list[Item]]]:
    """One client: its wall time; several (interleaved): each one's own time, the sum of its items' latencies."""
    if len(per_client) == 1:
        return [(summarise(per_client[0], wall), per_client[0])]
    return [(summarise(items, sum(i.latency for i in items)), items) for items in per_client]


def run_scorings(clients: list[Client], questions: list[Question]) -> list[tuple[dict, list[Item]]]:
    t0 = time.perf_counter()
    per = interleave(clients, len(questions), lambda c, i: c.score(questions[i], f"d{questions[i].doc}/q{i}"))
    return _summaries(per, time.perf_counter() - t0)


def run_scoring(client: Client, questions: list[Question]) -> tuple[dict, list[Item]]:
    return run_scorings([client], questions)[0]


def run_agentics(clients: list[Client], sessions: list[Session], sizes: Sizes) -> list[tuple[dict, list[Item]]]:
    """Turn t of every session, then turn t + 1: each history grows by its own reply and a tool output
    (each client keeps its own histories: a session's replies come from the server that answered it)."""
    order = [(t, k) for t in range(sizes.turns) for k in range(len(sessions))]
    histories = {id(c): [list(s.first) for s in sessions] for c in clients}

    def turn(client: Client, i: int) -> Item:
        t, k = order[i]
        h = histories[id(client)][k]
        item = client.stream(tuple(h), sizes.reply_tokens, key=f"s{k}/t{t}")
        if t + 1 < sizes.turns:
            h += [r.token for r in item.rows] + list(sessions[k].tools[t])
        return item

    t0 = time.perf_counter()
    per = interleave(clients, len(order), turn)
    return _summaries(per, time.perf_counter() - t0)


def run_agentic(client: Client, sessions: list[Session], sizes: Sizes) -> tuple[dict, list[Item]]:
    return run_agentics([client], sessions, sizes)[0]


def run_decodes(clients: list[Client], sizes: Sizes, seed: int) -> list[dict]:
    """Aggregate decode tokens/s of `n` concurrent streams, for each n of the probe; with several clients,
    each n on every client in turn (the first alternating with n), before the next n."""
    def one(client: Client, results: list, prompts: list[tuple[int, ...]], k: int) -> None:
        try:
            results[k] = client.stream(prompts[k], sizes.probe_tokens, key=f"probe{len(prompts)}/{k}")
        except BaseException as e:  # noqa: BLE001 - reported below
            results[k] = e

    def probe(client: Client, n: int) -> dict:
        prompts = probe_prompts(sizes, seed, n)
        results: list[Item | BaseException] = [None] * n  # type: ignore[list-item]
        threads = [threading.Thread(target=one, args=(client, results, prompts, k)) for k in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"{client.name}: decode probe with {n} streams: {errors[0]}")
        span = max(r.last_at for r in results) - min(r.first_at for r in results)  # type: ignore[union-attr]
        toks = sum(len(r.rows) - 1 for r in results)  # type: ignore[union-attr]
        return {"streams": n, "tokens": toks, "span_s": span, "tok_s": toks / span if span > 0 else math.nan}

    streams = list(sizes.probe_streams)
    per = interleave(clients, len(streams), lambda c, i: probe(c, streams[i]))
    return [{str(d["streams"]): d for d in probes} for probes in per]


def run_decode(client: Client, sizes: Sizes, seed: int) -> dict:
    return run_decodes([client], sizes, seed)[0]


def wait_warm(base: str, timeout: float) -> float | None:
    """Seconds until our server's lazy warm-up (first forward, probes) is done, by its
    `radixflow_warmup_pending` gauge; None if it has no such gauge. The warm-up runs in the server's quiet
    gaps: with the two servers up side by side it would otherwise run while llama-server answers."""
    t0 = time.perf_counter()
    while True:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            text = r.read().decode()
        line = next((x for x in text.splitlines() if x.startswith("radixflow_warmup_pending")), None)
        if line is None:
            return None
        if float(line.split()[-1]) == 0:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"radixflow's warm-up was not done within {timeout:.0f} s")
        time.sleep(1.0)


# ============================================================================ servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(base: str, proc: subprocess.Popen, timeout: float, log: Path) -> float:
    """Seconds from now until /health answers 200 (the caller started `proc` just before)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before /health answered:\n" + tail(log))
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"/health did not answer 200 within {timeout:.0f} s:\n" + tail(log))


def tail(log: Path, n: int = 15) -> str:
    """The log's last lines but the access lines of the /health polls."""
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if "GET /health" not in x]
        return "\n".join(lines[-n:])
    except OSError:
        return "(no log)"


class Server:
    """A server process started here, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, cmd: list[str], log: Path, env: dict | None = None, startup_timeout: float = 900.0):
        self.startup_timeout = startup_timeout
        self.port = int(cmd[cmd.index("--port") + 1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.cmd = cmd
        self._env = env

    def __enter__(self) -> Server:
        self._f = open(self.log, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self._f, stderr=subprocess.STDOUT, env=self._env,
                                     start_new_session=True)
        try:
            wait_health(self.base, self.proc, self.startup_timeout, self.log)
        except BaseException:
            self.__exit__()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._f.close()


def radixflow_cmd(model: str, port: int) -> list[str]:
    return [sys.executable, "-m", "radixflow.cli", "serve", "--model", model, "--torch-threads", str(THREADS),
            "--host", "127.0.0.1", "--port", str(port)]


def radixflow_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


# llama-server's settings per workload, read from tools/server/server-context.cpp of the vendored llama.cpp:
# - a hybrid model's recurrent state cannot be rolled back, so a cached prefix is reused only from a context
#   checkpoint; checkpoints are taken near a prompt's end, at 4 + n_ubatch and 4 tokens before it (and at
#   chat message starts, which token-id prompts lack), up to --ctx-checkpoints (32) per slot; restoring one
#   erases the later ones.
# - scoring: one slot holds the document; a candidate (2-12 tokens) that differs from the previous one
#   restores the checkpoint 4 + n_ubatch tokens before the previous prompt's end, so the recompute is about
#   n_ubatch + candidate tokens: a small ubatch (64) keeps it small (prefill runs in 64-token ubatches).
#   The parallel form (a question's candidates as one multi-prompt request on 4 slots) starts each slot
#   from whatever it held, with no checkpoint shared across slots.
# - agentic: one slot per session (-np = sessions), each keeps its whole history (prompt + reply) live, so a
#   turn extends it without any restore; slots stay separate (no unified KV, which clears idle slots into
#   the RAM prompt cache on every new task), --cache-ram stays as a fallback; ubatch at its default 512.
# - decode probe: 16 slots in one unified KV cache, so 16 streams decode in one batch.
LLAMA_SETTINGS = {
    "scoring": ["-np", "1", "-c", "8192", "-ub", "{scoring_ubatch}", "--ctx-checkpoints", "32",
                "--cache-ram", "8192"],
    "scoring-parallel": ["-np", "4", "-kvu", "-c", "16384", "-ub", "{scoring_ubatch}", "--ctx-checkpoints", "32",
                         "--cache-ram", "8192"],
    "agentic": ["-np", "{sessions}", "-c", "{agentic_ctx}", "--ctx-checkpoints", "32", "--cache-ram", "8192",
                "--no-cache-idle-slots"],
    "decode": ["-np", "16", "-kvu", "-c", "4096"],
}


def llama_cmd(binary: Path, gguf: Path, port: int, workload: str, sizes: Sizes, scoring_ubatch: int = 64) -> list[str]:
    longest = sizes.first_len[1] + (sizes.turns - 1) * (sizes.reply_tokens + sizes.tool_len[1]) + sizes.reply_tokens
    fill = {"sessions": str(sizes.sessions), "agentic_ctx": str(sizes.sessions * max(4096, 2 * longest)),
            "scoring_ubatch": str(scoring_ubatch)}
    extra = [a.format(**fill) for a in LLAMA_SETTINGS[workload]]
    return [str(binary), "-m", str(gguf), "-t", str(THREADS), "-tb", str(THREADS), "--host", "127.0.0.1",
            "--port", str(port), "--no-webui", *extra]


def default_llama_server() -> Path:
    env = os.environ.get("LLAMA_SERVER")
    return Path(env) if env else Path(sys.prefix) / "share" / "radixflow-llamacpp" / "bin" / "llama-server"


def model_dir(model: str) -> Path:
    """The model's HF directory, built (in a child process, so its memory is returned) if not yet cached."""
    code = "import sys; from radixflow.engine.tiny import resolve_model; print(resolve_model(sys.argv[1]))"
    res = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, env=radixflow_env())
    if res.returncode != 0:
        raise RuntimeError(f"could not build {model}: {res.stderr.strip().splitlines()[-1:]}")
    return Path(res.stdout.strip().splitlines()[-1])


def gguf_of(path: Path) -> Path:
    """The model's F32 GGUF with a placeholder vocabulary (llama-server needs one: benchmarks/llamacpp_convert.py),
    next to its directory, converted once."""
    out = path.parent / f"{path.name}.f32.vocab.gguf"
    if not out.is_file():
        convert = Path(__file__).with_name("llamacpp_convert.py")
        res = subprocess.run([sys.executable, str(convert), "--placeholder-vocab", str(path), str(out)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            lines = [x for x in (res.stderr + res.stdout).splitlines() if x.strip()]
            raise RuntimeError("GGUF conversion failed: " + (lines[-1] if lines else f"exit {res.returncode}"))
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# ============================================================================ one model
def _llama_plan(args) -> list[tuple[str, str]]:
    """(llama-server setting, workload) in the order run."""
    return [("scoring-parallel" if args.llama_scoring == "parallel" else "scoring", "scoring"),
            ("agentic", "agentic")] + ([] if args.no_decode else [("decode", "decode")])


def _ours(model: str, args, logdir: Path):
    name = model.replace(":", "-")
    return Server(radixflow_cmd(model, free_port()), logdir / f"{name}-radixflow.log", radixflow_env(),
                  args.startup_timeout)


def _llama(model: str, args, sizes: Sizes, gguf: Path, setting: str, logdir: Path) -> tuple[Server, str]:
    name = model.replace(":", "-")
    cmd = llama_cmd(args.llama_server, gguf, free_port(), setting, sizes, args.llama_scoring_ubatch)
    return (Server(cmd, logdir / f"{name}-llama-{setting}.log", None, args.startup_timeout),
            " ".join(cmd[cmd.index("--no-webui") + 1:]))


def _run(workload: str, clients: list[Client], questions, sessions, sizes: Sizes, seed: int) -> list:
    if workload == "scoring":
        return run_scorings(clients, questions)
    if workload == "agentic":
        return run_agentics(clients, sessions, sizes)
    return run_decodes(clients, sizes, seed)


def _side_by_side(model, args, sizes, gguf, questions, sessions, logdir, out, say):
    """Both servers up at once, every workload's items interleaved one by one (`interleave`): ours for the
    whole model, llama-server restarted with each workload's settings. Ours finishes its lazy warm-up first
    (`wait_warm`: it would run in ours' quiet gaps, i.e. while llama-server answers)."""
    ours: dict = {}
    theirs: dict = {"startups_s": {}, "settings": {}}
    items: dict[str, dict[str, list[Item]]] = {"radixflow": {}, "llama-server": {}}
    out["loads"]["radixflow_before"] = load()
    say(f"   radixflow serve ({load()}) ...", flush=True)
    with _ours(model, args, logdir) as srv:
        ours.update(startup_s=srv.startup_s, command=" ".join(srv.cmd[1:]))
        say(f"   radixflow: /health 200 after {srv.startup_s:.1f} s", flush=True)
        warm = wait_warm(srv.base, args.startup_timeout)
        ours["warmup_wait_s"] = warm
        if warm is not None:
            say(f"   radixflow: warm-up done {warm:.1f} s later", flush=True)
        mine = RadixflowClient(srv.base, model, args.request_timeout)
        for setting, workload in _llama_plan(args):
            lsrv, settings = _llama(model, args, sizes, gguf, setting, logdir)
            theirs["settings"][workload] = settings
            with lsrv:
                theirs["startups_s"][workload] = lsrv.startup_s
                say(f"   llama-server [{settings}]: /health 200 after {lsrv.startup_s:.1f} s", flush=True)
                other = LlamaClient(lsrv.base, model, args.request_timeout, args.llama_scoring)
                a, b = _run(workload, [mine, other], questions, sessions, sizes, args.seed)
            if workload == "decode":
                ours["decode"], theirs["decode"] = a, b
            else:
                ours[workload], items["radixflow"][workload] = a
                theirs[workload], items["llama-server"][workload] = b
                say(f"   {workload}, item by item: radixflow {ours[workload]['wall_s']:.1f} s, llama-server "
                    f"{theirs[workload]['wall_s']:.1f} s ({load()})", flush=True)
    theirs["startup_s"] = theirs["startups_s"]["scoring"]
    out["loads"]["llama_after"] = load()
    return {"radixflow": ours, "llama-server": theirs}, items


def _one_at_a_time(model, args, sizes, gguf, questions, sessions, logdir, out, say):
    """Each server alone: ours runs every workload, then llama-server (`--order sequential`, or `--only`)."""
    results: dict[str, dict] = {}
    items: dict[str, dict[str, list[Item]]] = {}
    if args.only != "llama":
        out["loads"]["radixflow_before"] = load()
        say(f"   radixflow serve ({load()}) ...", flush=True)
        with _ours(model, args, logdir) as srv:
            c = RadixflowClient(srv.base, model, args.request_timeout)
            r: dict = {"startup_s": srv.startup_s, "command": " ".join(srv.cmd[1:])}
            say(f"   radixflow: /health 200 after {srv.startup_s:.1f} s", flush=True)
            (r["scoring"], s_items), = _run("scoring", [c], questions, sessions, sizes, args.seed)
            say(f"   radixflow scoring: {r['scoring']['wall_s']:.1f} s ({load()})", flush=True)
            (r["agentic"], a_items), = _run("agentic", [c], questions, sessions, sizes, args.seed)
            say(f"   radixflow agentic: {r['agentic']['wall_s']:.1f} s ({load()})", flush=True)
            if not args.no_decode:
                r["decode"], = _run("decode", [c], questions, sessions, sizes, args.seed)
        results["radixflow"], items["radixflow"] = r, {"scoring": s_items, "agentic": a_items}
        out["loads"]["radixflow_after"] = load()
    if args.only != "radixflow":
        r = {"startups_s": {}, "settings": {}}
        li: dict[str, list[Item]] = {}
        out["loads"]["llama_before"] = load()
        for setting, workload in _llama_plan(args):
            lsrv, settings = _llama(model, args, sizes, gguf, setting, logdir)
            r["settings"][workload] = settings
            with lsrv:
                c = LlamaClient(lsrv.base, model, args.request_timeout, args.llama_scoring)
                r["startups_s"][workload] = lsrv.startup_s
                say(f"   llama-server [{settings}]: /health 200 after {lsrv.startup_s:.1f} s", flush=True)
                res, = _run(workload, [c], questions, sessions, sizes, args.seed)
                if workload == "decode":
                    r["decode"] = res
                else:
                    r[workload], li[workload] = res
                    say(f"   llama-server {workload}: {r[workload]['wall_s']:.1f} s ({load()})", flush=True)
        r["startup_s"] = r["startups_s"]["scoring"]
        results["llama-server"], items["llama-server"] = r, li
        out["loads"]["llama_after"] = load()
    return results, items


def bench_model(model: str, args, sizes: Sizes, logdir: Path) -> dict:
    say = print
    questions, sessions = scoring_workload(sizes, args.seed), agentic_workload(sizes, args.seed)
    t = time.perf_counter()
    path = model_dir(model)
    out: dict = {"model": model, "model_dir": str(path), "loads": {}, "servers": {}}
    say(f"\n== {model}: {path} ({time.perf_counter() - t:.0f} s to have it in the cache)")
    gguf = None
    if args.only != "radixflow":
        t = time.perf_counter()
        gguf = gguf_of(path)
        say(f"   GGUF {gguf} ({time.perf_counter() - t:.0f} s)")
    side_by_side = args.only == "both" and args.order == "interleaved"
    out["order"] = "interleaved" if side_by_side else "sequential"
    run = _side_by_side if side_by_side else _one_at_a_time
    results, items = run(model, args, sizes, gguf, questions, sessions, logdir, out, say)
    out["servers"] = results
    if "radixflow" in results and "llama-server" in results:
        top1 = {"scoring": compare_scoring(items["radixflow"]["scoring"], items["llama-server"]["scoring"]),
                "agentic": compare_agentic(items["radixflow"]["agentic"], items["llama-server"]["agentic"])}
        out["top1"] = top1
        out["ratios"] = ratios(results["radixflow"], results["llama-server"])
        out["verdicts"] = verdicts(out["ratios"], top1, results["radixflow"]["startup_s"])
    elif "radixflow" in results:
        out["verdicts"] = {"start-up <= 15 s": results["radixflow"]["startup_s"] <= 15.0}
    print_model(out)
    return out


def _f(x, nd=1, suffix="") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}{suffix}"


def print_model(out: dict) -> None:
    res = out["servers"]
    print(f"\n{out['model']}")
    print(f"{'workload':9} {'server':13} {'start s':>8} {'wall s':>7} {'items/s':>8} {'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'prompt':>7} {'computed':>9} {'cached':>7}")
    for w in ("scoring", "agentic"):
        for name, r in res.items():
            if w not in r:
                continue
            s = r[w]
            start = r["startups_s"].get(w) if "startups_s" in r else r["startup_s"]
            print(f"{w:9} {name:13} {_f(start):>8} {_f(s['wall_s']):>7} {_f(s['items_per_s'], 3):>8} "
                  f"{_f(s['ttft_p50_s'], 2):>9} {_f(s['ttft_p99_s'], 2):>9} {s['prompt_tokens']:>7} "
                  f"{s['computed']:>9} {s['cached']:>7}")
    for name, r in res.items():
        if "decode" in r:
            d = r["decode"]
            rates = [f"{v['streams']} stream(s) {v['tok_s']:.1f} tok/s" for v in d.values()]
            print(f"decode    {name:13} " + ", ".join(rates))
    if "llama-server" in res:
        for w, s in res["llama-server"]["settings"].items():
            print(f"llama-server {w}: {s}")
    if "top1" in out:
        s, a = out["top1"]["scoring"], out["top1"]["agentic"]
        print(f"top-1: scoring {s['same']}/{s['rows']} rows the same (max |dlogprob| {_f(s['max_abs_dlogprob'], 4)}); "
              f"agentic {a['same']}/{a['replies']} replies ({a['same_tokens']}/{a['tokens']} tokens), "
              f"{a['not_compared']} not compared" + ("; " + "; ".join(s["mismatches"] + a["mismatches"])
                                                     if s["mismatches"] or a["mismatches"] else ""))
    if "ratios" in out:
        r = out["ratios"]
        print("ours / llama-server: " + ", ".join(f"{k} {_f(v, 2)}" for k, v in r.items()))
    for k, v in out.get("verdicts", {}).items():
        print(f"  [{'-' if v is None else 'PASS' if v else 'FAIL'}] {k}")


def cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown CPU")
    flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    simd = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    return f"{name} ({simd}, {os.cpu_count()} cores)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma list (default: %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the documents and sessions")
    p.add_argument("--length-scale", type=float, default=1.0, help="multiplies every prompt length (tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("both", "radixflow", "llama"), default="both",
                   help="run one server only (radixflow: llama-server need not be installed)")
    p.add_argument("--llama-server", type=Path, default=default_llama_server(),
                   help=f"the llama-server binary (default: the venv's, from {INSTALL}; env LLAMA_SERVER)")
    p.add_argument("--llama-scoring", choices=("sequential", "parallel"), default="sequential",
                   help="llama-server's form of the scoring workload (see the module doc)")
    p.add_argument("--llama-scoring-ubatch", type=int, default=64,
                   help="llama-server's -ub on the scoring workload (see LLAMA_SETTINGS)")
    p.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved: both servers up, each workload's items alternate between them one by one "
                        "(a machine's drift falls on both); sequential: one server after the other")
    p.add_argument("--no-decode", action="store_true", help="skip the decode probe")
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for /health 200")
    p.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only != "radixflow" and not (args.llama_server.is_file() and os.access(args.llama_server, os.X_OK)):
        print(f"serve_peers: llama-server is not installed ({args.llama_server}): run {INSTALL} "
              f"[VENV], or pass --only radixflow", file=sys.stderr)
        return 2
    try:
        sizes = Sizes().scaled(args.scale, args.length_scale)
    except ValueError as e:
        print(f"serve_peers: {e}", file=sys.stderr)
        return 2
    import tempfile
    logdir = args.logs or Path(tempfile.mkdtemp(prefix="serve_peers-"))
    logdir.mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    run = {"cpu": cpu_name(), "threads": THREADS, "seed": args.seed, "scale": args.scale,
           "length_scale": args.length_scale, "sizes": asdict(sizes), "command": " ".join(sys.argv),
           "llama_scoring": args.llama_scoring, "start": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "load_start": load(), "logs": str(logdir)}
    print(f"serve_peers on {run['cpu']}, {THREADS} threads per server, {load()}; logs in {logdir}")
    q, s = scoring_workload(sizes, args.seed), agentic_workload(sizes, args.seed)
    print(f"scoring: {len(q)} questions x {sizes.candidates} candidates, "
          f"{sum(len(p) for x in q for p in x.prompts)} prompt tokens; agentic: {len(s)} sessions x "
          f"{sizes.turns} turns of {sizes.reply_tokens}-token replies")
    out: list[dict] = []
    t0 = time.perf_counter()

    def write() -> None:   # after every model, so a run cut short keeps what it measured
        if args.json:
            args.json.write_text(json.dumps({"run": run, "models": out}, indent=2, default=str))

    for m in models:
        try:
            out.append(bench_model(m, args, sizes, logdir))
        except RuntimeError as e:   # a server that did not start or answered an error: the next model still runs
            print(f"serve_peers: {m}: {e}", file=sys.stderr)
            out.append({"model": m, "error": str(e)})
        write()
    run["wall_s"] = time.perf_counter() - t0
    run["load_end"] = load()
    print(f"\n{len(models)} model(s) in {run['wall_s']:.0f} s; {load()}")
    write()
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any("error" in m for m in out) else 0


if __name__ == "__main__":
    sys.exit(main())
