"""Engine speed at real model size: radixflow beside transformers and llama.cpp, and the machine's limit.

Models: the random-weight real-size models (`random:qwen3.5-0.8b`, `random:nemotron-h-1b`,
`random:qwen3-0.6b`; docs/models.md), fp32 everywhere, the same threads for all three systems.
Cases per model:
  (a) prefill of one 2,048-token prompt;
  (b) a round-sized batch: one scheduler round of T = 8,192 tokens over 16 rows, half of them resuming
      from cached prefixes (two 1,024-token parents prefilled first, four children each) and half fresh;
      the rows are what radixflow's Scheduler produces for these requests (state captures included);
  (c) one decode step of 16 rows after a shared 2,048-token prompt (16 branches, each stepping its own
      copy of the prompt's state in its slot, as a server's decode round steps each stream's);
  (d) the same step for 1 row (one stream).
`--decode-only` runs (c) and (d) beside llama.cpp only (no transformers model is loaded): a few minutes.
radixflow runs each case as one batched forward (the engine's model call, as EngineExecutor makes it).
transformers runs `AutoModelForCausalLM` with the faster of its sdpa and eager attention (probed per
model): (a) one call, (b) the 16 rows one after another (it has no ragged batching; a resuming row
continues from a copy of its parent's cache, copied outside the timing), (c) one batched call over a
16-row cache. llama.cpp (llama-cpp-python 0.3.36, scripts/install_llamacpp.sh) runs the model converted
to an F32 GGUF (benchmarks/llamacpp_convert.py) with an F32 KV cache: (a) one sequence, (b) the 16
rows as 16 sequences of one batch (parents copied into the resuming ones with seq_cp), (c) 16 sequences
copied from one prefilled prompt, one token each. Only the last position's logits are computed.

Timing: for each case the three systems run interleaved, `--repeats` times (default 3), after one small
untimed warm-up per model; tokens/s is from the median. llama.cpp runs in the first `--llamacpp-repeats` of
them (default 1): its ratio is printed, not a target, and its timed forwards were the run's largest share
(docs/results.md, "Run time"); `--llamacpp-repeats 3` gives its median too. Setup (parents' prefill, cache
copies) is never timed. Same-model proof: top-1 agreement of every logit row (last position of each prompt)
between ours and transformers, and ours and llama.cpp, with the largest |difference| (scale: the logits' std).
Peak fraction: the forward's FLOPs (dense layers on the scheduled tokens, the head on the logit rows,
attention and scan terms from radixflow.spec) per second of radixflow's median, over the `torch.mm` GFLOP/s
measured on the model's own GEMM shapes (every nn.Linear of the model at the case's token count, capped at
2,048 rows; best of 3), weighted by their FLOPs.

    python benchmarks/engine_peers.py --json out.json          # all models and cases at the issue's sizes

Peak fraction is printed for transformers (and llama.cpp, in the JSON) beside ours: the same FLOPs over
their median. `--plan` runs nothing and prints a lower bound of the run's time: every system computes
at least the forward's FLOPs on each timed repeat and in setup, at no more than the fastest torch.mm
rate on the model's own GEMM shapes (best of 5; noise only lowers a peak), plus the least cost of
building, converting and loading a model not yet cached (see `plan`).
    python benchmarks/engine_peers.py --plan                  # the full run's bound
    python benchmarks/engine_peers.py --plan --repeats 1
    python benchmarks/engine_peers.py --models random:qwen3-0.6b --cases a --repeats 1 --scale 0.25
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.batch import ExecResult, Sample  # noqa: E402
from radixflow.core.branch import Branch  # noqa: E402
from radixflow.core.policies import get_arm  # noqa: E402
from radixflow.core.scheduler import Scheduler  # noqa: E402
from radixflow.engine.engine import Engine, EngineConfig  # noqa: E402
from radixflow.engine.loader import LoadedModel, load_model  # noqa: E402
from radixflow.engine.memory import pool_sizes  # noqa: E402
from radixflow.engine.models import RowInput, build_model  # noqa: E402
from radixflow.engine.models.host_memory import glibc_defaults, release_freed  # noqa: E402
from radixflow.engine.random_models import RANDOM_MODELS, ensure_random_model, random_config  # noqa: E402
from radixflow.engine.sampling import SamplingParams  # noqa: E402
from radixflow.engine.seeded import default_cache_dir  # noqa: E402
from radixflow.spec import spec_from_hf_config  # noqa: E402

BLOCK = 16
INTERVAL = 512
MAX_LEN = 4096    # the engines' max_model_len: the longest prompt here is ~1,800 (b) or 2,048 (a) tokens
CASES = ("a", "b", "c", "d")
DECODE = ("c", "d")   # one decode step: transformers and llama.cpp copy the prompt's cache per row
SYSTEMS = ("radixflow", "transformers", "llamacpp")
GREEDY1 = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass
class Row:
    """One row of a case: `tokens` computed at positions [start, start + len) after `prefix`."""
    prefix: tuple[int, ...]
    tokens: list[int]
    logits: bool = True   # the row ends its prompt: its last position's logits are asked for

    @property
    def start(self) -> int:
        return len(self.prefix)


@dataclass
class Case:
    name: str
    label: str
    rows: list[Row]
    ours_rows: list[RowInput]
    engine: Engine | None
    restore: list[tuple[int, tuple]] = field(default_factory=list)   # (slot, saved state) before each run

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)


# ----------------------------------------------------------------------------------------- cases
def _ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=gen).tolist()   # byte tokens: the tokenizer's ids


def _engine_config(model, path: Path, tokens: int, slots: int, rows: int = 16) -> EngineConfig:
    """The config of an engine over `model` whose pools hold `tokens` tokens of KV and `slots` state slots."""
    sc = SchedulerConfig(max_num_seqs=rows, max_num_batched_tokens=8192, block_size=BLOCK,
                         state_interval=INTERVAL)
    probe = model.allocate_cache(1, BLOCK, 1)
    page_bytes, slot_bytes = probe.kv_bytes_per_token * BLOCK, probe.state_bytes_per_slot
    del probe
    pages = max(-(-tokens // BLOCK) + 4 * rows, MAX_LEN // BLOCK)
    kv, st = max(page_bytes, 1) * pages, (slot_bytes * slots if model.is_hybrid else 0)
    budget = kv + st
    return EngineConfig(model=str(path), scheduler=sc, kv_cache_memory=budget,
                        state_memory_fraction=st / budget if st else 0.3, max_model_len=MAX_LEN)


def _engine(lm: LoadedModel, tokens: int, slots: int, rows: int = 16) -> Engine:
    return Engine(_engine_config(lm.model, lm.path, tokens, slots, rows), loaded=lm)


class DryEngine:
    """The engine's scheduling side over a model on the meta device, for `--plan`: the same Scheduler,
    pool sizes and requests as `_engine`'s, every round completed at once with token 0 sampled. The
    rounds it makes are the run's: the model's outputs reach the scheduler only as the sampled tokens,
    and every prompt here asks one token (the rows are scheduled before any sampling)."""

    def __init__(self, model, tokens: int, slots: int, rows: int = 16):
        cfg = _engine_config(model, Path("-"), tokens, slots, rows)
        probe = model.allocate_cache(1, BLOCK, 1)
        pages, n_slots = pool_sizes(cfg.kv_cache_memory, probe.kv_bytes_per_token, probe.state_bytes_per_slot,
                                    BLOCK, MAX_LEN, rows, model.is_hybrid, cfg.state_memory_fraction)
        sc = replace(cfg.scheduler, num_kv_pages=pages, num_state_slots=max(n_slots, 0))
        self.scheduler = Scheduler(sc, get_arm(cfg.policy), model.is_hybrid)
        self.now = 0.0

    def make_branch(self, request_id: str, index: int, prompt: list[int], params: SamplingParams) -> Branch:
        return Branch(request_id, index, tuple(prompt), "", self.now, params.max_tokens)

    def add(self, branches: list[Branch]) -> None:
        for b in branches:
            self.scheduler.add(b)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self, now: float) -> None:
        self.now = max(self.now, now)
        self.scheduler.admit(self.now)
        batch = self.scheduler.schedule(self.now)
        if batch:
            samples = {i: Sample(0) for i, f in enumerate(batch.fragments) if f.samples}
            self.scheduler.complete(batch, ExecResult(0.0, samples), self.now)


def _schedule(engine: Engine | DryEngine, prompts: list[list[int]], tag: str) -> list:
    """Add the prompts as requests and return the fragments of the round the scheduler makes of them."""
    for i, p in enumerate(prompts):
        engine.add([engine.make_branch(f"{tag}{i}", 0, p, copy.copy(GREEDY1))])
    engine.now += 1.0   # past any admission timer
    engine.scheduler.admit(engine.now)
    return list(engine.scheduler.schedule(engine.now).fragments)


def _rows_of(fragments) -> tuple[list[Row], list[RowInput]]:
    rows, ours = [], []
    for f in fragments:
        if f.after is not None:
            raise RuntimeError("a dependent row (hand-off) in the benchmark round: the case is not as designed")
        rows.append(Row(tuple(f.branch.tokens[:f.start]), list(f.token_ids), f.samples))
        ours.append(RowInput(list(f.token_ids), f.start, list(f.page_table), f.state_in, list(f.state_out),
                             [f.num_tokens - 1] if f.samples else [], None))
    return rows, ours


def _finish(engine: Engine, fragments, rows: list[RowInput]) -> list[tuple[int, tuple]]:
    """Page copies the executor would make before the forward, and the slots to restore before each
    repeat (a slot both read and written by the round)."""
    for f in fragments:
        for src, dst in f.copies_before:
            engine.cache.copy_page(src, dst)
    read = {r.state_in for r in rows if r.state_in is not None}
    written = {s for r in rows for _, s in r.state_out}
    return [(s, _save_slot(engine, s)) for s in sorted(read & written)]


def _save_slot(engine: Engine, slot: int) -> tuple:
    c = engine.cache
    return tuple(t[slot].clone() for t in (*c.conv, *c.rec))


def _load_slot(engine: Engine, slot: int, saved: tuple) -> None:
    c = engine.cache
    for t, s in zip((*c.conv, *c.rec), saved):
        t[slot].copy_(s)


def case_a(lm: LoadedModel, gen: torch.Generator, n: int) -> Case:
    engine = _engine(lm, n + 64, 16)
    frags = _schedule(engine, [_ids(gen, n)], "a")
    rows, ours = _rows_of(frags)
    return Case("a", f"1 x {n}", rows, ours, engine, _finish(engine, frags, ours))


def case_b(lm: LoadedModel, gen: torch.Generator, budget: int, parent_len: int, n_rows: int) -> Case:
    engine = _engine(lm, 2 * parent_len + budget + 4096, 48)
    frags = round_b(engine, gen, budget, parent_len, n_rows)
    rows, ours = _rows_of(frags)
    return Case("b", f"{len(rows)} rows, round of {sum(len(r.tokens) for r in rows)}", rows, ours, engine,
                _finish(engine, frags, ours))


def round_b(engine: Engine | DryEngine, gen: torch.Generator, budget: int, parent_len: int, n_rows: int) -> list:
    """Two parents prefilled first (untimed, through the engine), then n_rows requests: half extend a
    parent (resume from its cached prefix), half fresh; lengths drawn so the round is full. Returns
    the fragments of the round the scheduler makes of them."""
    parents = [_ids(gen, parent_len), _ids(gen, parent_len)]
    for i, p in enumerate(parents):
        engine.add([engine.make_branch(f"p{i}", 0, p, copy.copy(GREEDY1))])
    while engine.has_unfinished:
        engine.step(engine.now + 1.0)
    per_row = budget / n_rows
    lengths = [int(per_row * (0.5 + torch.rand((), generator=gen).item())) for _ in range(n_rows)]
    lengths = [max(16, round(x * (budget + per_row / 2) / sum(lengths))) for x in lengths]
    # even rows extend parent 0 or 1 (alternately), odd rows are fresh prompts
    prompts = [parents[(i // 2) % 2] + _ids(gen, n) if i % 2 == 0 else _ids(gen, n) for i, n in enumerate(lengths)]
    return _schedule(engine, prompts, "b")


def case_c(lm: LoadedModel, gen: torch.Generator, context: int, n_rows: int, name: str = "c") -> Case:
    """The shared prompt prefilled once (untimed), its state captured at its end and copied into one slot
    a row; then n_rows decode rows, each one new token at position `context`, reading the shared pages and
    stepping its own slot (state in = state out: a server's decode round, `BatchContext.states_in_place`),
    restored before each repeat."""
    engine = _engine(lm, context + 64 + n_rows * BLOCK, n_rows + 8)
    model, cache = lm.model, engine.cache
    prompt, tokens = _c_tokens(gen, context, n_rows)
    n_pages = -(-context // BLOCK)
    pages = list(range(n_pages))
    slot = n_rows if model.is_hybrid else None
    out = [(context, slot)] if model.is_hybrid else []
    model([RowInput(prompt, 0, pages, None, out, [], None)], cache)
    rows, ours = [], []
    for i, t in enumerate(tokens):
        own = n_pages + i if context % BLOCK == 0 else None
        if own is None:   # the prompt's last page is partial: each row gets its own copy
            own = n_pages + i
            cache.copy_page(n_pages - 1, own)
            table = pages[:-1] + [own]
        else:
            table = pages + [own]
        rows.append(Row(tuple(prompt), [t]))
        if model.is_hybrid:
            cache.copy_state(slot, i)
        ours.append(RowInput([t], context, table, i if model.is_hybrid else None, [(1, i)] if model.is_hybrid
                             else [], [0], None))
    restore = [(i, _save_slot(engine, i)) for i in range(n_rows)] if model.is_hybrid else []
    label = f"{n_rows} row{'s' if n_rows > 1 else ''} decode at {context}"
    return Case(name, label, rows, ours, engine, restore=restore)


def _c_tokens(gen: torch.Generator, context: int, n_rows: int) -> tuple[list[int], list[int]]:
    """(c): the shared prompt and each row's one new token."""
    return _ids(gen, context), _ids(gen, n_rows)


# ------------------------------------------------------------------------------------- runners
class Ours:
    def __init__(self, lm: LoadedModel):
        self.model = lm.model

    def run(self, case: Case) -> tuple[float, torch.Tensor]:
        for slot, saved in case.restore:
            _load_slot(case.engine, slot, saved)
        t = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(case.ours_rows, case.engine.cache)
        return time.perf_counter() - t, logits


class Transformers:
    def __init__(self, path: Path, impl: str | None = None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.impl = impl or "sdpa"
        self.model.set_attn_implementation(self.impl)
        self.prefix_cache: dict[tuple, object] = {}
        self.batched: object | None = None
        self.hybrid = any(k in str(self.model.config.to_dict()) for k in ("linear_attention", "mamba"))

    def probe(self, ids: list[int]) -> dict[str, float]:
        """Prefill seconds of `ids` under each attention implementation (best of 2); keeps the faster."""
        times = {}
        for impl in ("sdpa", "eager"):
            self.model.set_attn_implementation(impl)
            best = math.inf
            for _ in range(2):
                t = time.perf_counter()
                self._forward(torch.tensor([ids]))
                best = min(best, time.perf_counter() - t)
            times[impl] = best
        self.impl = min(times, key=times.get)
        self.model.set_attn_implementation(self.impl)
        return times

    def _forward(self, ids: torch.Tensor, cache=None, use_cache: bool = False):
        with torch.inference_mode():
            return self.model(ids, past_key_values=cache, use_cache=use_cache or cache is not None,
                              logits_to_keep=1)

    def prepare(self, case: Case) -> None:
        """Caches of every distinct prefix (untimed); for (c) one 16-row cache."""
        self.prefix_cache.clear()
        self.batched = None
        for r in case.rows:
            if r.prefix and r.prefix not in self.prefix_cache:
                out = self._forward(torch.tensor([list(r.prefix)]), use_cache=True)
                self.prefix_cache[r.prefix] = out.past_key_values
        if case.name in DECODE:
            (cache,) = self.prefix_cache.values()
            cache.reorder_cache(torch.zeros(len(case.rows), dtype=torch.long))
            self.batched = cache
            self.prefix_cache.clear()

    def run(self, case: Case) -> tuple[float, torch.Tensor]:
        if case.name in DECODE:
            cache = copy.deepcopy(self.batched) if self.hybrid else self.batched
            ids = torch.tensor([[r.tokens[0]] for r in case.rows])
            t = time.perf_counter()
            out = self._forward(ids, cache)
            elapsed = time.perf_counter() - t
            if not self.hybrid:
                cache.crop(-1)   # back to the prompt: the appended position dropped
            return elapsed, out.logits[:, -1]
        elapsed, logits = 0.0, []
        for r in case.rows:
            cache = copy.deepcopy(self.prefix_cache[r.prefix]) if r.prefix else None
            t = time.perf_counter()
            out = self._forward(torch.tensor([r.tokens]), cache)
            elapsed += time.perf_counter() - t
            del cache
            if r.logits:
                logits.append(out.logits[0, -1])
        return elapsed, torch.stack(logits)

    def release(self) -> None:
        self.prefix_cache.clear()
        self.batched = None


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API: one context per case, one batch per run."""

    def __init__(self, gguf: Path, threads: int):
        import llama_cpp as lc

        self.lc = lc
        _quiet_llamacpp(lc)
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        _LLAMA_ERRORS.clear()
        self.model = lc.llama_model_load_from_file(str(gguf).encode(), mp)
        if not self.model:   # its own one-line reason, e.g. an unknown architecture
            raise RuntimeError(_LLAMA_ERRORS[0] if _LLAMA_ERRORS else f"could not load {gguf}")
        self.threads = threads
        self.ctx = None

    def prepare(self, case: Case) -> None:
        lc = self.lc
        self.release()
        seqs = len(case.rows) + 2
        cells = sum(len(r.tokens) for r in case.rows) + sum(len(p) for p in {r.prefix for r in case.rows})
        cp = lc.llama_context_default_params()
        cp.n_ctx = 256 * (-(-(cells + 64) // 256))
        cp.n_batch = max(512, case.tokens, max(len(p) for p in [r.prefix for r in case.rows] + [()]))
        cp.n_ubatch = 512
        cp.n_seq_max = seqs
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.type_k = cp.type_v = 0   # GGML_TYPE_F32: an F32 KV cache, as ours and transformers keep
        if hasattr(cp, "kv_unified"):
            cp.kv_unified = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        # untimed warm-up of the new context on row 0's sequence (each run clears it): its first
        # decode pages the weights in and sets its buffers up, which ours and transformers did in theirs
        self._decode([(0, 0, list(range(1, 17)), True)])
        # the distinct prefixes, each prefilled once into a parent sequence (ids seqs-1, seqs-2, ...)
        self.parent_of: dict[tuple, int] = {}
        for p in sorted({r.prefix for r in case.rows if r.prefix}):
            sid = seqs - 1 - len(self.parent_of)
            self._decode([(sid, 0, list(p), False)])
            self.parent_of[p] = sid

    def _decode(self, items: list[tuple[int, int, list[int], bool]]) -> list:
        """One llama_decode over (seq, start, tokens, want_last_logits) items; the logits rows asked."""
        lc = self.lc
        n = sum(len(t) for _, _, t, _ in items)
        batch = lc.llama_batch_init(n, 0, 1)
        try:
            k, want = 0, []
            for seq, start, toks, last in items:
                for j, tok in enumerate(toks):
                    batch.token[k] = tok
                    batch.pos[k] = start + j
                    batch.n_seq_id[k] = 1
                    batch.seq_id[k][0] = seq
                    batch.logits[k] = last and j == len(toks) - 1
                    if batch.logits[k]:
                        want.append(k)
                    k += 1
            batch.n_tokens = n
            rc = lc.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            return [torch.tensor(lc.llama_get_logits_ith(self.ctx, i)[:self.n_vocab]) for i in want]
        finally:
            lc.llama_batch_free(batch)

    def run(self, case: Case) -> tuple[float, torch.Tensor]:
        lc = self.lc
        for i in range(len(case.rows)):   # the row sequences back to their parents' state, untimed
            lc.llama_memory_seq_rm(self.mem, i, -1, -1)
        for i, r in enumerate(case.rows):
            if r.prefix:
                lc.llama_memory_seq_cp(self.mem, self.parent_of[r.prefix], i, -1, -1)
        items = [(i, r.start, r.tokens, r.logits) for i, r in enumerate(case.rows)]
        t = time.perf_counter()
        logits = self._decode(items)
        return time.perf_counter() - t, torch.stack(logits)

    def release(self) -> None:
        if self.ctx is not None:
            self.lc.llama_free(self.ctx)
            self.ctx = None

    def close(self) -> None:
        self.release()
        self.lc.llama_model_free(self.model)


_LLAMA_ERRORS: list[str] = []
_LLAMA_LOG: list = []   # keeps the ctypes callback alive


def _quiet_llamacpp(lc) -> None:
    """llama.cpp's log silenced; its error lines kept (the reason a model load fails)."""
    if _LLAMA_LOG:
        return

    @lc.llama_log_callback
    def log(level, text, user_data):
        if level == 4 and text:   # GGML_LOG_LEVEL_ERROR
            line = text.decode("utf-8", "replace").strip()
            if line:
                _LLAMA_ERRORS.append(line)

    _LLAMA_LOG.append(log)
    lc.llama_log_set(log, None)


def llamacpp_gguf(path: Path) -> tuple[Path | None, str | None]:
    """The model's F32 GGUF (converted once, next to the model directory), or (None, why not)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None, "llama-cpp-python is not installed (scripts/install_llamacpp.sh)"
    out = path.parent / f"{path.name}.f32.gguf"
    if not out.is_file():
        res = subprocess.run([sys.executable, str(Path(__file__).with_name("llamacpp_convert.py")), str(path),
                              str(out)], capture_output=True, text=True)
        if res.returncode != 0:
            lines = [x for x in (res.stderr + res.stdout).splitlines() if x.strip()]
            return None, "conversion failed: " + (lines[-1] if lines else f"exit {res.returncode}")
    return out, None


# ----------------------------------------------------------------------------------- FLOPs, peak
def linear_shapes(hf_model) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """(in, out) of every nn.Linear of the transformers model but the head, and the head's."""
    shapes, head = [], None
    for name, m in hf_model.named_modules():
        if isinstance(m, torch.nn.Linear):
            if name.endswith("lm_head"):
                head = (m.in_features, m.out_features)
            else:
                shapes.append((m.in_features, m.out_features))
    return shapes, head


def rows_flops(rows: list[Row], shapes, head, spec) -> float:
    """The forward's FLOPs over `rows`: dense layers on every token, the head on the logit rows,
    attention over each row's context and the recurrent scans (radixflow.spec's terms)."""
    dense = 2 * sum(k * n for k, n in shapes) * sum(len(r.tokens) for r in rows)
    head_f = 2 * head[0] * head[1] * sum(r.logits for r in rows)
    attn = sum(spec.attention_flops(len(r.tokens), r.start) for r in rows)
    rec = sum(spec.recurrent_flops(len(r.tokens)) for r in rows)
    return dense + head_f + attn + rec


def case_flops(case: Case, shapes, head, spec) -> float:
    return rows_flops(case.rows, shapes, head, spec)


def _best_mm(m: int, k: int, n: int, repeats: int) -> float:
    """Seconds of the fastest of `repeats` torch.mm calls [m, k] x [k, n] after one untimed call: on a
    shared machine noise only slows a call, so the best one is the closest to the machine's rate."""
    a, w = torch.randn(m, k), torch.randn(n, k)
    torch.mm(a, w.t())
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, w.t())
        best = min(best, time.perf_counter() - t)
    return best


def mm_peak(case: Case, shapes, head, cap: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of torch.mm over the model's GEMM shapes at the case's row count (<= cap), by FLOP weight."""
    m = min(case.tokens, cap)
    counts: dict[tuple[int, int, int], int] = {}
    for k, n in shapes:
        counts[(m, k, n)] = counts.get((m, k, n), 0) + 1
    lm = sum(r.logits for r in case.rows)
    counts[(lm, *head)] = counts.get((lm, *head), 0) + 1
    flops = secs = 0.0
    for (mm, k, n), c in counts.items():
        flops += 2 * mm * k * n * c
        secs += _best_mm(mm, k, n, repeats) * c
    return flops / secs


def machine_peak(shapes, m: int = 2048, repeats: int = 5) -> tuple[float, tuple[int, int, int]]:
    """The fastest torch.mm rate (FLOP/s) over the model's distinct GEMM shapes at `m` rows, and its shape:
    the most any system here is taken to reach on this model's arithmetic."""
    rates = {(m, k, n): 2 * m * k * n / _best_mm(m, k, n, repeats) for k, n in sorted(set(shapes))}
    best = max(rates, key=rates.get)
    return rates[best], best


def meta_hf_model(cfg: dict):
    """transformers' model of `cfg` on the meta device (its Linear shapes, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"}))


def read_rate(nbytes: int, repeats: int = 3) -> float:
    """Bytes/s of the fastest of `repeats` sums over `nbytes` of fp32 (a read of every byte once): the
    machine's bound for a decode step, which reads every weight once."""
    x = torch.ones(nbytes // 4)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    del x
    return nbytes / best


# ------------------------------------------------------------------------------------- the bench
def bench_model(name: str, args, out: list[dict]) -> None:
    from transformers import AutoConfig  # noqa: F401  (imported before llama.cpp's threads start)

    t_model = time.perf_counter()
    path = ensure_random_model(name)
    cfg = json.loads((path / "config.json").read_text())
    spec = spec_from_hf_config(cfg, name)
    gen = torch.Generator().manual_seed(args.seed)
    lm = load_model(path)
    hf = None if args.decode_only else Transformers(path)
    shapes, head = linear_shapes(hf.model if hf is not None else meta_hf_model(cfg))
    if head is None:   # a tied head is the embedding
        head = (cfg["hidden_size"], cfg["vocab_size"])
    probe_ids = _ids(gen, max(32, int(256 * args.scale)))
    impl_times = hf.probe(probe_ids) if hf is not None else {}
    ours = Ours(lm)
    warm_row = RowInput(probe_ids, 0, list(range(16)), None, [], [len(probe_ids) - 1])
    warm = Case("w", "warm-up", [Row((), probe_ids)], [warm_row], _engine(lm, 512, 4))
    ours.run(warm)
    del warm
    gguf, note = (None, "--no-llamacpp") if args.no_llamacpp else llamacpp_gguf(path)
    llama = None
    if gguf is not None:
        try:
            llama = LlamaCpp(gguf, torch.get_num_threads())
        except Exception as e:   # llama.cpp refuses the architecture: its one-line reason
            note = f"llama.cpp: {str(e).splitlines()[0]}"
    n_params = json.loads((path / "model.safetensors.index.json").read_text())["metadata"]["total_size"] / 4e9
    probe = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in impl_times.items())
    tf = (f"transformers attention {hf.impl} (probe {len(probe_ids)} tokens: {probe})" if hf is not None
          else "transformers not run (--decode-only)")
    print(f"\n{name} [setup {time.perf_counter() - t_model:.0f} s]: {n_params:.2f}B parameters, {tf}"
          + (f"; {note}" if note else ""), flush=True)
    lm_bytes = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                    for p in lm.model.parameters()}.values())   # each storage once: fused views, tied head
    for cname in args.cases:
        t_case = time.perf_counter()
        case = make_case(cname, lm, gen, args)
        runners = {"radixflow": ours}
        if hf is not None:
            with peer_heap(case):
                hf.prepare(case)
            runners["transformers"] = hf
        if llama is not None:
            try:
                with peer_heap(case):
                    llama.prepare(case)
                runners["llamacpp"] = llama
            except Exception as e:
                note = f"llama.cpp: {str(e).splitlines()[0]}"
        times: dict[str, list[float]] = {k: [] for k in runners}
        logits: dict[str, torch.Tensor] = {}
        for i in range(args.repeats):
            for sysname, runner in runners.items():
                if sysname == "llamacpp" and i >= args.llamacpp_repeats:
                    continue
                with peer_heap(case) if sysname != "radixflow" else contextlib.nullcontext():
                    t, lg = runner.run(case)
                times[sysname].append(t)
                logits[sysname] = lg
        med = {k: statistics.median(v) for k, v in times.items()}
        tps = {k: case.tokens / v for k, v in med.items()}
        flops = case_flops(case, shapes, head, spec)
        peak = mm_peak(case, shapes, head)
        frac = {k: flops / v / peak for k, v in med.items()}
        agree = {k: _agreement(logits["radixflow"], logits[k]) for k in logits if k != "radixflow"}
        row = {"model": name, "case": cname, "label": case.label, "tokens": case.tokens,
               "radixflow_tps": round(tps["radixflow"], 2),
               "transformers_tps": round(tps["transformers"], 2) if "transformers" in tps else None,
               "llamacpp_tps": round(tps["llamacpp"], 2) if "llamacpp" in tps else None,
               "peak_fraction": round(frac["radixflow"], 4),
               "transformers_peak_fraction": round(frac["transformers"], 4) if "transformers" in frac else None,
               "llamacpp_peak_fraction": round(frac["llamacpp"], 4) if "llamacpp" in frac else None,
               "mm_gflops": round(peak / 1e9, 1),
               "forward_gflop": round(flops / 1e9, 2),
               "transformers_attention": hf.impl if hf is not None else None,
               "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
               "agreement": agree}
        if "llamacpp" not in tps:
            row["llamacpp_note"] = note or "not run"
        if cname in DECODE:   # a decode step reads every weight once: the rate it reached and the machine's
            row["weights_gb"] = round(lm_bytes / 1e9, 3)
            row["weights_gbps"] = {k: round(lm_bytes / v / 1e9, 2) for k, v in med.items()}
            row["read_gbps"] = round(read_rate(lm_bytes) / 1e9, 2)
        row["wall_s"] = round(time.perf_counter() - t_case, 1)
        out.append(row)
        _print_row(row)
        if args.json:   # after every case: a run cut short keeps what it measured
            write_json(args, out)
        with peer_heap(case):
            if hf is not None:
                hf.release()
            if llama is not None:
                llama.release()
        del case
        gc.collect()
        release_freed()   # the case's freed heap back to the system before the next case builds its own
    if llama is not None:
        llama.close()


def peer_heap(case: Case):
    """The heap setting transformers and llama.cpp run under: for decode (c), glibc's own large-block
    behaviour (host_memory.glibc_defaults; transformers' 16-row cache is 7.5 GB on qwen3-0.6b and, with
    the heap setting ours applies kept in force, grew the process past this 23 GB machine); for (a) and
    (b) the setting ours runs under, as in every earlier figure (their blocks are mostly under 32 MB, and
    returning the heap between systems would make ours fault its reused blocks in again)."""
    return glibc_defaults() if case.name in DECODE else contextlib.nullcontext()


def make_case(cname: str, lm: LoadedModel, gen: torch.Generator, args) -> Case:
    s = args.scale

    def blocks(n: int) -> int:
        return max(BLOCK, int(n * s) // BLOCK * BLOCK)

    if cname == "a":
        return case_a(lm, gen, blocks(args.prefill_len))
    if cname == "b":
        return case_b(lm, gen, max(INTERVAL, int(args.round_tokens * s) // INTERVAL * INTERVAL),
                      blocks(args.parent_len), args.rows)
    return case_c(lm, gen, blocks(args.context), args.rows if cname == "c" else 1, cname)


def dry_rows(cname: str, model, gen: torch.Generator, args) -> list[Row]:
    """The rows `make_case` would build, from the same generator draws, without running a model:
    (a) and (b) from the scheduler of a DryEngine, (c) as case_c lays them out."""
    s = args.scale

    def blocks(n: int) -> int:
        return max(BLOCK, int(n * s) // BLOCK * BLOCK)

    if cname == "a":
        n = blocks(args.prefill_len)
        return _rows_of(_schedule(DryEngine(model, n + 64, 16), [_ids(gen, n)], "a"))[0]
    if cname == "b":
        budget, parent = max(INTERVAL, int(args.round_tokens * s) // INTERVAL * INTERVAL), blocks(args.parent_len)
        dry = DryEngine(model, 2 * parent + budget + 4096, 48)
        return _rows_of(round_b(dry, gen, budget, parent, args.rows))[0]
    prompt, tokens = _c_tokens(gen, blocks(args.context), args.rows if cname == "c" else 1)
    return [Row(tuple(prompt), [t]) for t in tokens]


def _copy_rate() -> float:
    """Bytes/s of one memory copy (best of 3, 256 MiB): what reading, writing or converting weights
    costs at the least per byte."""
    a = torch.empty(64 << 20)
    b = torch.empty_like(a)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return a.numel() * 4 / best


def _randn_rate() -> float:
    """Normal draws per second from a seeded generator (best of 3, 16M): the builder's least cost."""
    gen = torch.Generator().manual_seed(0)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        torch.randn(1 << 24, generator=gen)
        best = min(best, time.perf_counter() - t)
    return (1 << 24) / best


def plan(args) -> None:
    """`--plan`: a lower bound of the run's time, printed without running it. Every system computes at
    least the forward's FLOPs (rows_flops) on every timed repeat and once more in setup (each distinct
    cached prefix prefilled; the warm-ups: ours 1, transformers 4 probe prompts), and no system is
    taken to beat the fastest torch.mm rate measured on the model's own GEMM shapes at 2,048 rows;
    so time >= FLOPs / that rate. Building a model not yet cached costs at least its normal draws
    (measured rate), converting it to GGUF and loading it into ours and transformers at least one
    memory copy of its bytes each."""
    copy_rate, randn_rate = _copy_rate(), _randn_rate()
    n_sys = 1 + (not args.no_llamacpp) + (not args.decode_only)   # --decode-only: no transformers
    n_timed = (n_sys - (not args.no_llamacpp)) * args.repeats + (0 if args.no_llamacpp else args.llamacpp_repeats)
    print(f"plan: {n_sys} systems, {n_timed} timed forwards a case (ours"
          + ("" if args.decode_only else " and transformers") + f" {args.repeats} each"
          + ("" if args.no_llamacpp else f", llama.cpp {args.llamacpp_repeats}")
          + f"), cases {' '.join(args.cases)}, scale {args.scale}; "
          f"copy {copy_rate / 1e9:.1f} GB/s, randn {randn_rate / 1e6:.0f} M/s", flush=True)
    tot_flops = tot_secs = tot_io = 0.0
    for name in args.models:
        cfg = random_config(name)
        with torch.device("meta"):
            model = build_model(cfg)
        shapes, head = linear_shapes(meta_hf_model(cfg))
        head = head or (cfg["hidden_size"], cfg["vocab_size"])
        spec = spec_from_hf_config(cfg, name)
        peak, at = machine_peak(shapes)
        gen = torch.Generator().manual_seed(args.seed)
        probe = _ids(gen, max(32, int(256 * args.scale)))
        warm = rows_flops([Row((), probe)], shapes, head, spec) * (1 + (0 if args.decode_only else 4))   # tf: 4
        m_flops = warm
        print(f"\n{name}: peak {peak / 1e9:.0f} GFLOP/s (torch.mm {at[0]}x{at[1]}x{at[2]}, best of 5)", flush=True)
        for cname in args.cases:
            rows = dry_rows(cname, model, gen, args)
            timed = rows_flops(rows, shapes, head, spec)
            prefixes = {r.prefix for r in rows if r.prefix}
            setup = sum(rows_flops([Row((), list(p))], shapes, head, spec) for p in prefixes)
            c_flops = n_timed * timed + n_sys * setup
            m_flops += c_flops
            print(f"  ({cname}) {len(rows)} rows, {sum(len(r.tokens) for r in rows)} tokens: {timed / 1e12:.3f} TFLOP "
                  f"a forward, setup {setup / 1e12:.3f}; {n_timed} x forward + {n_sys} x setup = "
                  f"{c_flops / 1e12:.2f} TFLOP >= {c_flops / peak / 60:.1f} min", flush=True)
        n_bytes = 4 * sum(math.prod(p.shape) for p in model.state_dict().values())
        path = default_cache_dir() / f"random-{name.removeprefix('random:')}"
        io = 2 * n_bytes / copy_rate   # loaded into ours and transformers
        if not (path / "model.safetensors.index.json").is_file():
            io += n_bytes / 4 / randn_rate
        if not args.no_llamacpp and not (path.parent / f"{path.name}.f32.gguf").is_file():
            io += n_bytes / copy_rate
        secs = m_flops / peak
        tot_flops, tot_secs, tot_io = tot_flops + m_flops, tot_secs + secs, tot_io + io
        print(f"  {name}: {m_flops / 1e12:.1f} TFLOP >= {secs / 60:.1f} min of arithmetic, "
              f"+ >= {io:.0f} s to build/convert/load {n_bytes / 1e9:.1f} GB", flush=True)
    print(f"\nthe run: {tot_flops / 1e12:.1f} TFLOP at <= {tot_flops / tot_secs / 1e9:.0f} GFLOP/s "
          f"(each model at its own peak) >= {tot_secs / 60:.1f} min before any load, "
          f"{(tot_secs + tot_io) / 60:.1f} min with the least build/convert/load", flush=True)


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def profile_model(name: str, args) -> None:
    """Where radixflow's forward spends the time of each case: torch.profiler's self time by op."""
    lm = load_model(ensure_random_model(name))
    gen = torch.Generator().manual_seed(args.seed)
    for cname in args.cases:
        case = make_case(cname, lm, gen, args)
        ours = Ours(lm)
        ours.run(case)   # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            wall, _ = ours.run(case)
        ops = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
        total = sum(t for _, t in ops)
        gemm = sum(t for k, t in ops if k in GEMM_OPS)
        top = sorted(ops, key=lambda x: -x[1])[:8]
        print(f"{name} ({cname}) {case.label}: wall {wall:.2f} s, ops' self time {total:.2f} s; GEMM "
              f"(mm/addmm/bmm/baddbmm) {gemm / wall:.0%} of wall, other ops {(total - gemm) / wall:.0%}, "
              f"outside ops (Python, dispatch) {max(0.0, wall - total) / wall:.0%}", flush=True)
        print("    top ops by self time: " + ", ".join(f"{k} {t / wall:.0%}" for k, t in top), flush=True)
        del case


def _agreement(ours: torch.Tensor, other: torch.Tensor) -> dict:
    ours, other = ours.float(), other.float().reshape(ours.shape)
    return {"top1": f"{int((ours.argmax(-1) == other.argmax(-1)).sum())}/{ours.shape[0]}",
            "max_abs_diff": float((ours - other).abs().max()), "logit_std": float(ours.std())}


def _print_row(r: dict) -> None:
    ll, tf = r["llamacpp_tps"], r["transformers_tps"]
    ratio_t = f"{tf:8.1f} (x{r['radixflow_tps'] / tf:.2f})" if tf else "       - (not run)"
    ratio_l = f"x{r['radixflow_tps'] / ll:5.2f}" if ll else "  -  "
    n = len(r["seconds"].get("llamacpp", ()))
    runs = f" [{n} run{'s' if n > 1 else ''}]" if n else ""
    agree = "  ".join(f"{k} top-1 {v['top1']} max|d| {v['max_abs_diff']:.1e}" for k, v in r["agreement"].items())
    tfp = r["transformers_peak_fraction"]
    print(f"  ({r['case']}) {r['label']:30s} tok/s: radixflow {r['radixflow_tps']:8.1f}  transformers "
          f"{ratio_t}  llama.cpp{runs} "
          f"{(f'{ll:8.1f}' if ll else '       -')} ({ratio_l})  peak {r['peak_fraction']:.2f} "
          f"(transformers {f'{tfp:.2f}' if tfp is not None else '-'}) of "
          f"{r['mm_gflops']:.0f} GFLOP/s  [{r['wall_s']:.0f} s]", flush=True)
    if "weights_gbps" in r:
        print(f"      weights {r['weights_gb']:.2f} GB read a step: " + ", ".join(
            f"{k} {v:.1f} GB/s" for k, v in r["weights_gbps"].items())
            + f"; this machine reads {r['read_gbps']:.1f} GB/s (one sum over as many bytes)", flush=True)
    print(f"      same model: {agree}" + (f"   llama.cpp: {r['llamacpp_note']}" if ll is None else ""), flush=True)


def print_table(cases: list[dict]) -> None:
    print("\n| model | case | tokens | radixflow tok/s | transformers tok/s | llama.cpp tok/s (its runs) "
          "| vs transformers "
          "| vs llama.cpp | peak fraction (transformers) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in cases:
        ll, tf = r["llamacpp_tps"], r["transformers_tps"]
        vs_ll = f"{r['radixflow_tps'] / ll:.2f}x" if ll else "—"
        vs_tf = f"{r['radixflow_tps'] / tf:.2f}x" if tf else "—"
        tfp = r["transformers_peak_fraction"]
        ll_cell = f"{ll:.1f} ({len(r['seconds']['llamacpp'])})" if ll else f"— ({r['llamacpp_note']})"
        print(f"| {r['model']} | ({r['case']}) {r['label']} | {r['tokens']} | {r['radixflow_tps']:.1f} | "
              f"{f'{tf:.1f}' if tf else '—'} | {ll_cell} | "
              f"{vs_tf} | "
              f"{vs_ll} | {r['peak_fraction']:.2f} ({f'{tfp:.2f}' if tfp is not None else '—'}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(RANDOM_MODELS), choices=RANDOM_MODELS)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-len", type=int, default=2048, help="(a): the prompt's tokens")
    ap.add_argument("--round-tokens", type=int, default=8192, help="(b): the round's token budget T")
    ap.add_argument("--parent-len", type=int, default=1024, help="(b): each cached parent prefix's tokens")
    ap.add_argument("--context", type=int, default=2048, help="(c): the shared prompt's tokens")
    ap.add_argument("--rows", type=int, default=16, help="(b), (c): rows of the batch")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every case's token counts (quick runs; 1 = the sizes given)")
    ap.add_argument("--threads", type=int, default=None, help="threads for all three systems (default torch's)")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    ap.add_argument("--llamacpp-repeats", type=int, default=1,
                    help="llama.cpp runs in the first N of --repeats (default 1: its ratio is printed, not a target)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write {'cases': [...]} to this file")
    ap.add_argument("--plan", action="store_true",
                    help="print a lower bound of the run's time (FLOPs over the measured matmul peak), run nothing")
    ap.add_argument("--decode-only", action="store_true",
                    help="cases (c) and (d) only (16 rows and 1 row decoding), radixflow beside llama.cpp, no "
                         "transformers model loaded: a few minutes a model")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the comparison: where radixflow's forward spends each case's time, by op")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.decode_only:
        args.cases = list(DECODE)
    if not 1 <= args.llamacpp_repeats <= args.repeats:
        ap.error(f"--llamacpp-repeats must be in 1..--repeats ({args.repeats}), got {args.llamacpp_repeats}")
    if not 0 < args.scale <= 1:
        ap.error("--scale must be in (0, 1]")
    for flag in ("prefill_len", "round_tokens", "parent_len", "context"):
        if getattr(args, flag) < BLOCK:
            ap.error(f"--{flag.replace('_', '-')} must be >= {BLOCK}")
    if args.rows < 2:
        ap.error("--rows must be >= 2")
    if args.round_tokens < INTERVAL:
        ap.error(f"--round-tokens must be >= the state interval {INTERVAL}")
    if max(args.prefill_len, args.context, args.parent_len + 2 * args.round_tokens // args.rows) >= MAX_LEN:
        ap.error(f"a prompt would reach max_model_len {MAX_LEN}: lower --prefill-len / --context / --parent-len")
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load:.1f}; "
          f"repeats {args.repeats} (llama.cpp {args.llamacpp_repeats}), scale {args.scale}", flush=True)
    if args.plan:
        plan(args)
        return
    if args.profile:
        for name in args.models:
            profile_model(name, args)
            gc.collect()
        return
    t0 = time.perf_counter()
    out: list[dict] = []
    for name in args.models:
        bench_model(name, args, out)
        gc.collect()   # one model's three copies gone before the next loads
        release_freed()
    print_table(out)
    wall = time.perf_counter() - t0
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nrun time: {wall:.0f} s ({wall / 60:.1f} min) in all; load average {load:.1f} at start, "
          f"{load_end:.1f} at end", flush=True)
    if args.json:
        write_json(args, out, {"wall_s": round(wall, 1), "load_start": load, "load_end": load_end})


def write_json(args, out: list[dict], run: dict | None = None) -> None:
    args.json.write_text(json.dumps({"cases": out, "threads": torch.get_num_threads(), "repeats": args.repeats,
                                     "llamacpp_repeats": args.llamacpp_repeats,
                                     "scale": args.scale, "command": " ".join(sys.argv), **(run or {})},
                                    indent=2))


if __name__ == "__main__":
    main()
