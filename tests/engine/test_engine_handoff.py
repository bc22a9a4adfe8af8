"""In-forward state hand-off on the real engine (SPEC §15): a dependent row starts from the state its
producer row reaches in the same forward.

For every model family, the tiny models and every config variant the engine tests use, each kind of
dependent (handoff_cases.py: inside a page and a scan chunk, at the producer's end, d - a < K - 1, a
1-token dependent, level 2, a decode producer) gives the logits of a cold run of its whole prompt and
of transformers (each within fidelity.py's bound of the float64 truth); rows without `after` are
unchanged; bad producers are refused naming the row; without the conv window, the forked page or the
state the dependents are far outside the bound.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from handoff_cases import (
    BLOCK,
    CAPTURE_AT,
    CAPTURE_SLOT,
    CASES,
    DEPENDENTS,
    PRODUCER_SLOT,
    cold_logits,
    handoff_rows,
    ids,
    pages,
    run_handoff,
    setup_rows,
)

from fidelity import EPS32, FLOOR_ULPS, float64_mode, log_ratio, low_precision_attention, reference, set_threads
from radixflow.core.batch import Batch, Fragment
from radixflow.core.branch import Branch
from radixflow.engine.executor import EngineExecutor
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.models import batch as batch_mod
from radixflow.engine.models.activations import ACTIVATIONS
from radixflow.engine.tiny import ensure_tiny_model

ACTS = sorted(ACTIVATIONS)
# conftest's near-default weights make the linear layers' state nearly irrelevant (a Nemotron-H
# dependent started from the zero state is within 1e-4 of a cold run); scaled up, losing it costs ~0.1-1
AMPLIFY = 5.0


# ------------------------------------------------------------------ the model variants
def _variants() -> list[tuple[str, str, dict]]:
    """(id, base, changes): conftest's family configs, the tiny models, and the config variants of
    test_config_fields.py / test_attention_free.py."""
    out = [("qwen3_5", "qwen3_5", {}), ("nemotron_h", "nemotron_h", {}), ("qwen3", "qwen3", {}),
           ("tiny-qwen3.5", "tiny", {}), ("tiny-nemotron-h", "tiny", {}), ("tiny-qwen3", "tiny", {}),
           ("qwen3_5-attention_bias", "qwen3_5", {"attention_bias": True}),
           ("qwen3_5-odd_rotary", "qwen3_5", {"head_dim": 20, "rope_parameters": {
               "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
               "mrope_section": [1, 1, 1], "mrope_interleaved": True}}),
           ("qwen3_5-wrapper", "qwen3_5", {"tie_word_embeddings": True, "_wrap": True}),
           ("nemotron_h-attention_free", "nemotron_h", {"layers_block_type": [
               "linear_attention", "mlp", "linear_attention", "mlp", "linear_attention"]}),
           ("qwen3-tied", "qwen3", {"tie_word_embeddings": True})]
    out += [(f"qwen3_5-{a}", "qwen3_5", {"hidden_act": a}) for a in ACTS]
    out += [(f"nemotron_h-{ACTS[i]}-{ACTS[(i + 7) % len(ACTS)]}", "nemotron_h",
             {"mlp_hidden_act": ACTS[i], "mamba_hidden_act": ACTS[(i + 7) % len(ACTS)]}) for i in range(len(ACTS))]
    out += [(f"qwen3-{a}", "qwen3", {"hidden_act": a}) for a in ACTS]
    return out


VARIANTS = _variants()


@pytest.fixture(scope="module", params=VARIANTS, ids=[v[0] for v in VARIANTS])
def variant(request, tmp_path_factory, hf_model_factory, hf_configs):
    """(id, our model, transformers model) of one variant."""
    from transformers import AutoModelForCausalLM

    set_threads()
    name, base, changes = request.param
    d = tmp_path_factory.mktemp(name)
    if base == "tiny":
        path = ensure_tiny_model(name, cache_dir=d)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return name, load_model(path).model, hf
    changes = dict(changes)
    wrap = changes.pop("_wrap", False)
    hf = hf_model_factory({**hf_configs[base], **changes}, d)
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if changes.get("attention_bias") and pname.endswith("bias") and "self_attn" in pname:
                p.normal_(0.0, 0.5)  # biases large enough that dropping them would show (test_config_fields)
            if any(k in pname for k in ("in_proj", "conv1d")):
                p.mul_(AMPLIFY)
    hf.save_pretrained(d)
    if wrap:
        from test_config_fields import _wrap

        _wrap(d, None)
    return name, load_model(d).model, hf


def test_every_dependent_equals_a_cold_run_and_transformers(variant):
    name, model, hf = variant
    run, _ = run_handoff(model)
    for i, r in enumerate(run.rows):
        prompt = run.prompts[i]
        got = run.logits[i]
        cold = cold_logits(model, prompt)[r.start:]
        ref = reference(hf, prompt)[r.start:]
        assert got.shape == cold.shape
        ref.check(cold, f"{name} row {i} ({CASES[i]}): a cold run")
        ref.check(got, f"{name} row {i} ({CASES[i]})")


# ------------------------------------------------------------------ one model per family from here
@pytest.fixture(scope="module", params=["tiny-qwen3.5", "tiny-nemotron-h", "tiny-qwen3"])
def pair(request, tmp_path_factory):
    """The tiny models: unlike conftest's near-default random weights, their recurrent state matters
    (without it a dependent is ~1 off; conftest's Nemotron-H barely reads its SSD state)."""
    from transformers import AutoModelForCausalLM

    set_threads()
    path = ensure_tiny_model(request.param, cache_dir=tmp_path_factory.mktemp(request.param))
    return request.param, load_model(path).model, AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("row,at,slot", [(2, 37 + CAPTURE_AT, CAPTURE_SLOT), (1, 37, PRODUCER_SLOT)],
                         ids=["dependent", "producer-at-its-handoff-depth"])
def test_captures_beside_handoffs_resume_exactly(row, at, slot, pair):
    """Row 2 (a dependent) captures its state after 10 of its own tokens, and row 1 at the depth it
    hands to rows 2 and 11 (a branch checkpoint there); a later call resumes from each exactly."""
    _, model, hf = pair
    if not model.is_hybrid:
        pytest.skip("full attention has no state to capture")
    run, cache = run_handoff(model)
    r = run.rows[row]
    prompt = run.prompts[row][:at] + ids(25, 20)
    table = r.page_table[:at // BLOCK] + pages(140, len(prompt), at // BLOCK)
    cache.copy_page(r.page_table[at // BLOCK], table[at // BLOCK])  # its partial page, as the scheduler copies it
    rest = prompt[at:]
    out = model([RowInput(rest, at, table, slot, [], list(range(len(rest))))], cache)
    reference(hf, prompt)[at:].check(out, f"resumed at {at}")


def test_rows_without_after_unchanged(pair):
    """The level-0 rows of a hand-off call give the logits of the same rows run without dependents,
    the producers capturing at the dependents' depths instead (the same cuts of the scan): both within
    the bound of the float64 truth (the call's other rows change the matmuls' shapes, so not bitwise)."""
    name, model, hf = pair
    hybrid = model.is_hybrid
    run, _ = run_handoff(model)
    cache = model.allocate_cache(160, BLOCK, 8)
    first, seq = setup_rows(hybrid)
    model(first, cache)
    rows, _ = handoff_rows(seq, hybrid)
    cuts: dict[int, list[int]] = {}
    for r in rows:
        if r.after is not None:
            cuts.setdefault(r.after, []).append(r.start - rows[r.after].start)
    level0 = [i for i, r in enumerate(rows) if r.after is None]
    spare = 7  # an unused slot: these captures only cut the scan where the hand-offs do
    alone = [dataclasses.replace(rows[i], state_out=rows[i].state_out + [(k, spare) for k in cuts.get(i, [])]
                                 if hybrid and len(rows[i].token_ids) > 1 else rows[i].state_out) for i in level0]
    out = model(alone, cache)
    at = 0
    for i, r in zip(level0, alone):
        n = len(r.token_ids)
        ref = reference(hf, run.prompts[i])[r.start:]
        ref.check(out[at:at + n], f"{name} row {i} without dependents")
        ref.check(run.logits[i], f"{name} row {i} beside dependents")
        at += n


def test_bf16_dependents_stay_within_bf16_noise(pair, tmp_path):
    """bf16 weights, KV and conv windows (fp32 recurrent state): the dependents, and a bf16 cold run,
    stay within the bound that transformers' own bf16 error sets around the float64 truth."""
    name, model32, hf = pair
    if not model32.is_hybrid:
        pytest.skip("full attention: covered by fp32")
    model = load_model(ensure_tiny_model(name, cache_dir=tmp_path), dtype=torch.bfloat16).model
    with low_precision_attention():
        run, _ = run_handoff(model)
        for i in DEPENDENTS:
            ref = reference(hf, run.prompts[i], torch.bfloat16)[run.rows[i].start:]
            ref.check(cold_logits(model, run.prompts[i])[run.rows[i].start:], f"{name} row {i}: a bf16 cold run")
            ref.check(run.logits[i], f"{name} row {i} ({CASES[i]}) in bf16")


def test_full_attention_has_no_levels(pair):
    """On full attention `after` only means reading the producer's K/V: nothing recurrent is run."""
    name, model, _ = pair
    if model.is_hybrid:
        pytest.skip("hybrid")
    clock = batch_mod.LevelClock(torch.device("cpu"))
    run_handoff(model, clock)
    assert model.cache_layout().states == () and clock.seconds == 0.0, name


def _without(piece: str, monkeypatch) -> None:
    """Break one part of the hand-off (for the guard test below)."""
    if piece == "conv":
        build = batch_mod.BatchContext._build_conv_plan

        def no_conv(self, w):
            plan = build(self, w)
            plan.hand_dst = plan.hand_src = None
            return plan
        monkeypatch.setattr(batch_mod.BatchContext, "_build_conv_plan", no_conv)
    elif piece == "page":
        monkeypatch.setattr(batch_mod.BatchContext, "kv_forks", property(lambda self: None))
    else:
        plan = batch_mod.build_chunk_plan
        monkeypatch.setattr(batch_mod, "build_chunk_plan", lambda *a: plan(*a[:4]))
        monkeypatch.setattr(batch_mod.Level, "decode_hands", property(lambda self: None))


@pytest.mark.parametrize("piece", ["conv", "page", "state"])
def test_each_piece_of_the_handoff_matters(piece, pair, monkeypatch):
    """Guard for the tests above: without the conv windows, the forked page or the recurrent state
    the dependents fail the fidelity check by far (so passing it is no accident): the worst dependent
    is over 10x the bound (measured ratios: docs/models.md)."""
    name, model, hf = pair
    if not model.is_hybrid and piece != "page":
        pytest.skip("full attention hands on no state")
    if piece == "page" and model.cache_layout().num_kv_layers == 0:
        pytest.skip("no attention layer")
    _without(piece, monkeypatch)
    run, _ = run_handoff(model)
    ratios = {i: reference(hf, run.prompts[i])[run.rows[i].start:].ratio(run.logits[i]) for i in DEPENDENTS}
    worst = max(ratios.values())
    log_ratio(f"{name} without the {piece}: worst dependent", worst)
    assert worst > 10, (piece, ratios)


# ------------------------------------------------------------------ refused, naming the row
def _pair_rows(hybrid: bool, **dep) -> list[RowInput]:
    """A producer [0, 40) and a dependent after it at 20 (changed by `dep`)."""
    p = RowInput(ids(40, 1), 0, [0, 1, 2], None, [], [])
    d = RowInput(ids(8, 2), 20, [0, 5], None, [], [0], after=0)
    return [p, dataclasses.replace(d, **dep)]


BAD = [
    ({"after": 1}, r"row 1: after=1 makes a cycle of producers \(1 -> 1\)"),
    ({"after": 3}, r"row 1: after=3 names no row of this call"),
    ({"after": True}, r"row 1: after must be a row index"),
    ({"start": 0}, r"row 1: start 0 is outside its producer row 0's \(start, end\] = \(0, 40\]"),
    ({"start": 41, "page_table": [0, 1, 2, 6]}, r"row 1: start 41 is outside its producer row 0's"),
    ({"state_in": 1}, r"row 1: state_in is 1 but the row starts from producer row 0's state"),
    ({"page_table": [0, 1]}, r"row 1: page 1, which its start 20 cuts, is producer row 0's page 1"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(BAD)])
def test_bad_dependent_refused_naming_the_row(change, message, pair):
    _, model, _ = pair
    cache = model.allocate_cache(8, BLOCK, 2)
    with pytest.raises(ValueError, match=message):
        model(_pair_rows(model.is_hybrid, **change), cache)


def test_forward_reference_and_cycle_refused(pair):
    _, model, _ = pair
    cache = model.allocate_cache(8, BLOCK, 2)
    a = RowInput(ids(8, 2), 20, [0, 5], None, [], [0], after=1)
    b = RowInput(ids(40, 1), 0, [0, 1, 2], None, [], [])
    with pytest.raises(ValueError, match="row 0: after=1 names a later row; a producer must come before"):
        model([a, b], cache)
    c = RowInput(ids(8, 3), 30, [0, 6], None, [], [0], after=0)
    with pytest.raises(ValueError, match=r"row 0: after=1 makes a cycle of producers \(0 -> 1 -> 0\)"):
        model([a, c], cache)
    decode = RowInput([7], 39, [0, 1, 2], 0 if model.is_hybrid else None, [], [0])
    late = RowInput(ids(3, 4), 41, [0, 1, 2, 6], None, [], [0], after=0)
    with pytest.raises(ValueError, match=r"row 1: start 41 is outside its producer row 0's .* = \(39, 40\]"):
        model([decode, late], cache)


# ------------------------------------------------------------------ through the executor
def _fragments(rows: list[RowInput], prompts: dict[int, list[int]]) -> list[Fragment]:
    out = []
    for i, r in enumerate(rows):
        b = Branch(f"r{i}", 0, tuple(prompts[i]))
        out.append(Fragment(b, r.start, len(r.token_ids), r.page_table, r.state_in, list(r.state_out),
                            samples=r.start + len(r.token_ids) == len(prompts[i]), after=r.after))
    return out


def test_executor_runs_dependents_and_measures_the_extra_levels(pair):
    name, model, _ = pair
    hybrid = model.is_hybrid
    cache = model.allocate_cache(160, BLOCK, 8)
    ex = EngineExecutor(model, cache)
    first, seq = setup_rows(hybrid)
    model(first, cache)
    rows, prompts = handoff_rows(seq, hybrid)
    frags = _fragments(rows, prompts)
    result = ex.execute(Batch(1, frags))
    for i in range(len(rows)):
        want = int(cold_logits(model, prompts[i])[-1].argmax())
        assert result.samples[i].token == want, f"{name} row {i} ({CASES[i]})"
    # measured: levels >= 1 ran (hybrid only; row 10, after the decode row 9, is the one not folded)
    assert (result.handoff_time > 0) == hybrid
    plain = ex.execute(Batch(2, _fragments(first, {0: seq["x2"][:40], 1: seq["y"][:89]})))
    assert plain.handoff_time == 0.0                  # no dependent, no extra level


def test_executor_logs_each_extra_level_beside_its_rows_priced_at_level_0(pair):
    """With a calibration, every forward times level 0's recurrent work too (the fit the extra levels'
    rows are priced by) and logs each extra level (measured, level-0 equivalent); hybrids only."""
    from radixflow.engine.calibration import HandoffCalibration

    name, model, _ = pair
    cache = model.allocate_cache(160, BLOCK, 8)
    ex = EngineExecutor(model, cache)
    ex.calibration = cal = HandoffCalibration()
    first, seq = setup_rows(model.is_hybrid)
    model(first, cache)
    rows, prompts = handoff_rows(seq, model.is_hybrid)
    result = ex.execute(Batch(1, _fragments(rows, prompts)))
    if not model.is_hybrid:
        assert cal.levels_log == [] and not cal.base_levels, name
        return
    # folded dependents run in their producer's level; only row 10 (after the decode row 9) opens one
    depth = batch_mod.row_levels([r.after for r in rows], [len(r.token_ids) for r in rows])
    assert max(depth) == 1 and depth[10] == 1, depth
    assert len(cal.levels_log) == max(depth), name      # one entry per extra level
    assert sum(m for m, _ in cal.levels_log) == pytest.approx(result.handoff_time)
    assert all(e >= 0 for _, e in cal.levels_log)
    (ones, multi, tokens, longest, seconds), = cal.base_levels  # level 0 of this forward, timed
    lens = [len(r.token_ids) for r, d in zip(rows, depth) if d == 0]
    assert (ones, multi, tokens, longest) == (sum(n == 1 for n in lens), sum(n > 1 for n in lens),
                                              sum(n for n in lens if n > 1), max(lens))
    assert seconds > 0


def test_llm_accepts_the_handoff_flags():
    from radixflow import LLM

    llm = LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, max_num_seqs=4, max_num_batched_tokens=256,
              state_interval=64, checkpoints="branch", handoff="on", handoff_max_levels=3)
    assert (llm.engine.scheduler_config.handoff, llm.engine.scheduler_config.handoff_max_levels) == ("on", 3)
    with pytest.raises(ValueError, match="--handoff"):
        LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, handoff="sometimes")


# ------------------------------------------------------------------ end to end (the scheduler places them)
def _scheduler_emits_dependents() -> bool:
    """Does the core Scheduler place dependent rows? Four siblings over one document with branch
    checkpoints and handoff='on', as LLM.score makes
    them, driven to the end with a stand-in executor: any Fragment with `after`."""
    from radixflow.config import SchedulerConfig
    from radixflow.core.batch import ExecResult, Sample
    from radixflow.core.policies import get_arm
    from radixflow.core.scheduler import Scheduler

    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=BLOCK, state_interval=64,
                          checkpoints="branch", handoff="on", num_kv_pages=256, num_state_slots=64)
    s = Scheduler(cfg, get_arm("radixflow"), True)
    doc = ids(203, 1)
    for i in range(4):
        s.add(Branch("cap", i, tuple(doc + ids(3 + i, 10 + i))))
    now = 0.0
    for _ in range(20):
        if not s.has_unfinished:
            break
        s.admit(now)
        batch = s.schedule(now)
        if not batch:
            now = s.next_deadline if s.next_deadline is not None else now + 0.01
            continue
        if any(getattr(f, "after", None) is not None for f in batch.fragments):
            return True
        now += 0.001
        s.complete(batch, ExecResult(0.001, {i: Sample(1) for i, f in enumerate(batch.fragments) if f.samples}),
                   now)
    return False


def test_scheduler_places_dependent_rows():
    assert _scheduler_emits_dependents()


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-nemotron-h"])
def test_score_with_handoff_equals_a_cold_run(model):
    """LLM.score with branch checkpoints and hand-off: the candidates' next-token logprobs (and a
    cold run's) are within the bound of transformers' float64 logprobs, the cold run's top tokens are
    the same, and the engine reports the rows it ran as dependents."""
    from transformers import AutoModelForCausalLM

    from radixflow import LLM
    from radixflow.engine.tiny import resolve_model

    set_threads()
    doc = "The document says the sky is blue and the grass is green. " * 4
    cands = [" blue", " red", " green", " pink"]
    opts = dict(kv_cache_memory=64 << 20, max_num_seqs=8, max_num_batched_tokens=512, state_interval=64)
    warm = LLM(model, checkpoints="branch", handoff="on", **opts)
    got = warm.score(doc, cands, logprobs=5)
    cold = LLM(model, enable_prefix_caching=False, **opts).score(doc, cands, logprobs=5)
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32).eval()
    for cand, g, c in zip(cands, got.next_token_logprobs, cold.next_token_logprobs):
        assert [t for t, _ in g] == [t for t, _ in c]
        ref = reference(hf, warm._encode(doc) + warm._encode(cand)).log_softmax()[-1].tokens([t for t, _ in g])
        ref.check(torch.tensor([lp for _, lp in c]), f"{model} {cand!r}: a cold run's logprobs")
        ref.check(torch.tensor([lp for _, lp in g]), f"{model} {cand!r}: logprobs with hand-off")
    assert got.handoff_rows >= 1, "no candidate ran as a dependent row"
    # the candidates' producer is a multi-token row: they run folded into its scan, no extra level
    assert warm.engine.handoff_rows == got.handoff_rows and warm.engine.handoff_time == 0
    s = warm.engine.scheduler
    s.check_integrity()
    assert s.holds_nothing()



# ------------------------------------------------------------------ folded dependents (batch.FOLD)
def _random_plan(rng, hybrid: bool) -> tuple[list[RowInput], int, int]:
    """A random hand-off call of rows from position 0: multi-token and 1-token producers, dependents
    (of dependents too) at random depths in their producer's row, random captures into distinct slots;
    returns (rows, pages needed, slots needed)."""
    rows: list[RowInput] = []
    page, slot = 0, 0

    def fresh(n: int) -> list[int]:
        nonlocal page
        out = list(range(page, page + -(-n // BLOCK)))
        page += len(out)
        return out

    def captures(n: int) -> list[tuple[int, int]]:
        nonlocal slot
        if not hybrid or n < 2:
            return []
        ks = sorted(set(int(k) for k in rng.integers(1, n + 1, size=int(rng.integers(0, 3)))))
        out = [(k, slot + j) for j, k in enumerate(ks)]
        slot += len(out)
        return out

    for _ in range(int(rng.integers(1, 4))):
        n = 1 if rng.random() < 0.2 else int(rng.integers(2, 200))
        rows.append(RowInput(ids(n, int(rng.integers(1 << 30))), 0, fresh(n), None, captures(n), [n - 1]))
    for _ in range(int(rng.integers(1, 7))):
        p = int(rng.integers(len(rows)))
        prod = rows[p]
        a, b = prod.start, prod.start + len(prod.token_ids)
        d = int(rng.integers(a + 1, b + 1))
        n = 1 if rng.random() < 0.25 else int(rng.integers(2, 60))
        q = d // BLOCK
        table = prod.page_table[:q] + fresh(d + n - q * BLOCK)
        rows.append(RowInput(ids(n, int(rng.integers(1 << 30))), d, table, None, captures(n), list(range(n)),
                             after=p))
    return rows, page, slot


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-nemotron-h"])
def test_folded_dependents_equal_separate_levels(name, tmp_path):
    """150 random hand-off calls per model, each run with dependents folded into their producer's scan
    (`batch.FOLD`, the default) and in separate levels (the pre-fold engine): logits, captured states
    and conv windows of the folded run are as close to a float64 run of the same plan (the model widened
    under `float64_mode()`) as the separate levels' are, at the model's chunk and at smaller fixed chunks:
    within twice their error or a few fp32 ulps of the tensor (tests/fidelity.py's floor), a bound set by
    the arithmetic, not by one CPU's kernels. Twice, not 1.5x: a folded 1-token dependent runs the
    chunked form instead of the one-step recurrence, and its own dependents inherit that rounding."""
    import numpy as np

    from radixflow.engine.models.chunk_plan import ScanCosts

    set_threads()
    model = load_model(ensure_tiny_model(name, cache_dir=tmp_path)).model
    wide = copy.deepcopy(model).double()
    rng = np.random.default_rng(25)
    folded = split = 0
    for trial in range(150):
        rows, n_pages, n_slots = _random_plan(rng, True)
        chunk = int(rng.choice([64, 32, 16, 8]))
        costs = None if chunk == 64 else ScanCosts({chunk: 0.0}, {chunk: 0.0}, fixed=chunk)
        out = {}
        for fold, m in ((False, model), (True, model), (None, wide)):  # None: the float64 reference
            saved = batch_mod.FOLD
            batch_mod.FOLD = bool(fold)
            try:
                with float64_mode() if fold is None else contextlib.nullcontext():
                    cache = m.allocate_cache(n_pages + 1, BLOCK, max(n_slots, 1))
                    if fold:  # the folded run's context: what the counts below read
                        ctx = batch_mod.BatchContext(rows, BLOCK, torch.device("cpu"))
                    logits = m(rows, cache, None, costs)
            finally:
                batch_mod.FOLD = saved
            out[fold] = [logits, *cache.rec, *cache.conv]
        folded += bool(ctx.folded)
        split += any(lv.prefill_rows and lv.chunk_plan(chunk).fold_calls > 0 for lv in ctx.levels)
        for levels, fold, ref in zip(out[False], out[True], out[None]):
            ref = ref.double()
            floor = FLOOR_ULPS * EPS32 * float(ref.abs().max())
            base = float((levels.double() - ref).abs().max())
            got = float((fold.double() - ref).abs().max())
            assert got <= max(2 * base, floor), (trial, got, base, floor, rows)
    assert folded >= 100 and split >= 20, (folded, split)  # the fold (and its extra calls) was exercised
