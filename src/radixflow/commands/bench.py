"""Runs the scheduling arms on the real PyTorch engine over one trace and compares them."""

from __future__ import annotations

import time
from dataclasses import replace

from rich.progress import Progress

from radixflow.commands import flags
from radixflow.commands.common import (
    Plan,
    add_scheduler_flags,
    add_workload_flags,
    arms_payload,
    build_workloads,
    check_workload,
    policies,
    print_arms,
    run_meta,
    scheduler_config,
    write_json,
)
from radixflow.core.loop import run_trace
from radixflow.core.metrics import measure, merge
from radixflow.workloads.trace import fresh_copies

parse_bytes = flags.byte_size


def add_arguments(p) -> None:
    p.add_argument("--model", type=flags.engine_model, default="tiny-qwen3.5",
                   help="embedded tiny model name or an HF-format directory")
    flags.add(p, "--device", "--dtype")
    flags.add(p, "--kv-cache-memory", default=parse_bytes("256MiB"),
              help="bytes for KV pages + state slots (suffixes KiB/MiB/GiB)")
    flags.add(p, "--max-model-len", default=4096)
    flags.add(p, "--torch-threads", default=1,
              help="CPU threads for torch (1 is steadier on a shared 2-core machine; 0 = torch's default)")
    add_workload_flags(p, default_rate=40.0)
    add_scheduler_flags(p)
    p.add_argument("--handoff-compare", type=_handoff_modes, default=None, metavar="MODES",
                   help="comma list of --handoff modes (off,on,auto): run every arm under each on the same trace "
                        "and compare first tokens with the first run (instead of --handoff)")
    # A state boundary at every page (vLLM align mode keeps one per block): every shared prefix then
    # holds a boundary, so reuse does not depend on round timing (see docs/simulator.md).
    p.set_defaults(questions=48, article_scale=0.1, state_interval=16, stream="all", order="forward")
    flags.remember_defaults(p)


def _handoff_modes(text: str) -> tuple[str, ...]:
    import argparse

    from radixflow.config import HANDOFF_MODES

    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in HANDOFF_MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {', '.join(bad) or repr(text)}; choose from "
                                         f"{', '.join(HANDOFF_MODES)}")
    return modes


def _handoff_info(mode: str, choices: dict, log: list, cal, levels_log: list = (),
                  fold: tuple[int, float, float, float] = (0, 0.0, 0.0, 0.0), fold_log: list = ()) -> dict | None:
    """What the hand-off rule chose in one run, how the engine's calibrated cost model predicted the
    levels it took, their cost gross and marginal (engine/calibration.py), and what the folded
    dependents added to their producers' scans (`fold`: scan calls, predicted, measured and host-clock seconds;
    `fold_log`: per forward, predicted beside measured); None for `off`."""
    if mode == "off":
        return None
    from radixflow.engine.calibration import HandoffCalibration, fold_summary, levels_cost

    info: dict = {"choices": choices, "levels": HandoffCalibration(log=log).summary(),
                  "cost": levels_cost(list(levels_log)), "fold_calls": fold[0], "fold_time": fold[1],
                  "fold_measured": fold[2], "fold_wall": fold[3],
                  "fold": fold_summary(list(fold_log), cal.fold_fit if cal is not None else None),
                  "fold_log": list(fold_log)}
    for k in ("round", "token", "row", "level", "level_row", "level_token", "level_longest_token"):
        info["levels"].pop(k, None)
    info["levels"].pop("probe_seconds", None)
    if cal is not None:
        costs = cal.handoff_costs()
        info["fit"] = None if costs is None else {"round": costs.round, "token": costs.token, "level": costs.level,
                                                  "level_row": costs.level_row, "wait": costs.wait}
        b = cal.base_fit  # level 0's recurrent work: what the extra levels' rows are priced by
        info["level0_fit"] = {"base": b[0], "decode_row": b[1], "prefill_row": b[2], "prefill_token": b[3],
                              "longest_token": b[4]}
        info["probe_seconds"] = cal.probe_seconds
    return info


def _runs(args, handoff: str) -> list[tuple[str, str]]:
    """(arm, handoff mode) of each run, arms outermost; one mode unless --handoff-compare."""
    modes = args.handoff_compare or (handoff,)
    return [(arm.name, mode) for arm in policies(args) for mode in modes]


def plan(args) -> Plan:
    """The engine and scheduler configs and the meta of `bench` with these flags; loads nothing."""
    from radixflow.engine.engine import EngineConfig

    check_workload(args)
    if args.handoff_compare:
        flags.refuse(args, ["handoff"], "give the modes to compare in --handoff-compare alone")
    cfg = scheduler_config(args, args.model, default_budget=(16, 2048))
    engine = EngineConfig(model=args.model, policy=policies(args)[0].name, device=args.device,
                          dtype=args.dtype, scheduler=cfg, kv_cache_memory=args.kv_cache_memory,
                          max_model_len=args.max_model_len, seed=args.seed)
    meta = run_meta("bench", cfg, model=args.model, device=args.device, dtype=args.dtype,
                    torch_threads=args.torch_threads or None, kv_cache_memory=args.kv_cache_memory,
                    max_model_len=args.max_model_len, policies=[a.name for a in policies(args)],
                    workload=args.workload, seed=args.seed)
    if args.handoff_compare:
        meta["handoff_compare"] = list(args.handoff_compare)
    if args.workload == "multi-candidate":
        meta.update(stream=args.stream, order=args.order, questions=args.questions, rate=args.rate,
                    branch_gap=args.branch_gap, article_scale=args.article_scale, dataset_path=args.dataset_path)
    return Plan(meta, cfg, engine)


def load(args):
    """`bench`'s plan, loaded model and checked workloads for these flags (also the benchmarks' way in:
    benchmarks/engine_arms.py, engine_handoff.py). Sets no threads: `run` applies --torch-threads."""
    import torch

    from radixflow.engine.engine import _dtype
    from radixflow.engine.loader import load_model
    from radixflow.engine.tiny import resolve_model

    pl = plan(args)  # every flag checked before the model loads
    base = pl.engine
    if base.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {base.device} asked for, but torch sees no CUDA device")
    loaded = load_model(resolve_model(args.model), torch.device(base.device), _dtype(base.dtype))
    vocab = loaded.model.vocab_size
    workloads = build_workloads(args, args.model, vocab=min(vocab, 32000))
    for label, brs in workloads:
        for b in brs:
            if max(b.prompt) >= vocab:
                raise ValueError(f"{label}: branch {b.key} has token {max(b.prompt)} outside the vocabulary "
                                 f"[0, {vocab})")
    return pl, loaded, workloads


def run(args) -> int:
    import torch

    from radixflow.engine.engine import Engine

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    pl, loaded, workloads = load(args)
    cfg, base = pl.scheduler, pl.engine
    runs = _runs(args, cfg.handoff)
    results = []
    handoff_info: list[dict] = []  # per run: the rule's choices and the calibrated level predictions
    firsts: list[dict] = []
    used = None
    t0 = time.perf_counter()
    total = sum(len(w) for _, w in workloads) * len(runs)
    with Progress() as bar:
        task = bar.add_task(f"bench {args.model}", total=total)
        for arm, mode in runs:
            label = f"{arm} handoff={mode}" if args.handoff_compare else arm
            parts = []
            first: dict = {}
            choices = {"handoff": 0, "wait": 0, "recompute": 0}
            log: list = []
            levels_log: list = []  # (measured, level-0 equivalent) of every extra level
            cal = None
            # what folded dependents added to their producers' scans: calls, predicted, measured, host clock
            fold_calls, fold_time, fold_measured, fold_wall = 0, 0.0, 0.0, 0.0
            fold_log: list = []  # per forward that folded: (predicted, measured, calls, rows, copied, host clock)
            for _, brs in workloads:
                eng = Engine(replace(base, policy=arm, scheduler=replace(cfg, handoff=mode)), loaded=loaded)
                used = eng.scheduler_config
                copies = fresh_copies(brs)
                cal = eng.executor.calibration
                since = len(cal.log) if cal is not None else 0
                since_levels = len(cal.levels_log) if cal is not None else 0
                since_folds = len(cal.fold_log) if cal is not None else 0
                res = run_trace(eng.scheduler, eng.executor, copies, progress=lambda n: bar.advance(task, n))
                parts.append(measure(label, res))
                first.update({b.key: b.output[0] for b in copies if b.output})
                for k, v in eng.scheduler.handoff_choices.items():
                    choices[k] += v
                fold_calls += eng.executor.fold_calls
                fold_time += eng.executor.fold_time
                fold_measured += eng.executor.fold_measured
                fold_wall += eng.executor.fold_wall
                if cal is not None:
                    log += cal.log[since:]
                    levels_log += cal.levels_log[since_levels:]
                    fold_log += cal.fold_log[since_folds:]
                # this part's pools go before the next part's are allocated (else two at once: at real
                # size two 6 GiB pools took the process to 18 GB)
                del eng
            results.append(merge(label, parts))
            handoff_info.append(_handoff_info(mode, choices, log, cal, levels_log,
                                              (fold_calls, fold_time, fold_measured, fold_wall), fold_log))
            firsts.append(first)
    wall = time.perf_counter() - t0
    print_arms(results, f"{args.model} on {args.device} — S={cfg.max_num_seqs}, T={cfg.max_num_batched_tokens}, "
                        f"interval {cfg.state_interval}, workload {args.workload} ({len(workloads)} part(s))")
    agreement = []
    for arm, first in zip(results, firsts):
        same = sum(1 for k, v in first.items() if firsts[0].get(k) == v)
        agreement.append(100.0 * same / max(1, len(first)))
        if arm is not results[0]:
            print(f"first-token agreement {arm.policy} vs {results[0].policy}: {agreement[-1]:.2f}% "
                  f"({same}/{len(first)})")
    for r, info in zip(results, handoff_info):
        if r.handoff_rows:
            line = (f"hand-off {r.policy}: {r.handoff_rows} dependent rows in {r.handoff_rounds} of {r.rounds} "
                    f"rounds, up to {r.max_levels} levels; extra levels gross {r.handoff_time:.3f} s = "
                    f"{100 * r.handoff_time / max(r.host_time, 1e-12):.1f} % of T_host, "
                    f"{1000 * r.handoff_time / max(1, r.handoff_rounds):.1f} ms per hand-off round "
                    f"({100 * r.handoff_time / max(1, r.handoff_rounds) / max(r.cost_per_round, 1e-12):.1f} % of c̄)")
            cost = info["cost"] if info is not None else None
            if cost and cost["levels"]:
                line += (f"; marginal {cost['marginal']:.3f} s = {100 * cost['marginal'] / max(r.host_time, 1e-12):.1f}"
                         f" % of T_host (gross less the same rows priced at level 0: "
                         f"{cost['level0_equivalent']:.3f} s)")
            if info is not None:
                host = max(r.host_time, 1e-12)
                line += (f"; folded into their producers' scans: +{info['fold_calls']} scan calls, predicted "
                         f"{1000 * info['fold_time']:.1f} ms = {100 * info['fold_time'] / host:.2f} % of T_host, "
                         f"measured {1000 * info['fold_measured']:.1f} ms = "
                         f"{100 * info['fold_measured'] / host:.2f} % of T_host ({1000 * info['fold_wall']:.1f} ms "
                         f"on the host clock)")
            print(line)
    for r, info in zip(results, handoff_info):
        if info is None:
            continue
        c, p = info["choices"], info["levels"]
        line = (f"hand-off choices {r.policy}: {c['handoff']} hand-off, {c['wait']} wait, {c['recompute']} recompute")
        if p["levels"]:
            err = p["predicted_median"] / max(p["measured_median"], 1e-12) - 1
            line += (f"; levels taken {p['levels']}: calibrated prediction median "
                     f"{1000 * p['predicted_median']:.1f} ms vs measured median {1000 * p['measured_median']:.1f} ms "
                     f"({100 * err:+.1f} %), median error per level {100 * p['median_error']:.0f} %")
        fo = info["fold"]
        if fo["forwards"]:
            err = "n/a" if fo["error"] is None else f"{100 * fo['error']:+.1f} %"
            line += (f"; hand-off cost (folded, {fo['forwards']} rounds): predicted median "
                     f"{1000 * fo['predicted_median']:.3f} ms vs measured median {1000 * fo['measured_median']:.3f} ms "
                     f"per hand-off round (err {err}; per round: median {100 * fo['median_round_error']:+.0f} %, "
                     f"median size {100 * fo['median_abs_error']:.0f} %; sums {1000 * fo['predicted_total']:.1f} vs "
                     f"{1000 * fo['measured_total']:.1f} ms; host clock: median {1000 * fo['wall_median']:.3f} ms, "
                     f"sum {1000 * fo['wall_total']:.1f} ms)")
            if fo.get("fit"):
                f = fo["fit"]
                line += (f"; fold fitted: {1000 * f['call']:.4f} ms/call + {1000 * f['row']:.4f} ms/row in a call + "
                         f"{1000 * f['copy']:.4f} ms/row copied")
        fit = info.get("fit")
        if fit:
            line += (f"; fitted: round {1000 * fit['round']:.1f} ms + {1000 * fit['token']:.3f} ms/token, level "
                     f"{1000 * fit['level']:.2f} ms + {1000 * fit['level_row']:.2f} ms/row, wait "
                     f"{1000 * (fit['wait'] or 0):.0f} ms")
        b = info.get("level0_fit")
        if b and info["cost"]["levels"]:
            line += (f"; level 0 fitted: {1000 * b['base']:.2f} ms + {1000 * b['decode_row']:.3f} ms/1-token row + "
                     f"{1000 * b['prefill_row']:.3f} ms/longer row + {1000 * b['prefill_token']:.4f} ms/token + "
                     f"{1000 * b['longest_token']:.4f} ms/token of the longest")
        print(line)
    print(f"benchmarked {len(runs)} run(s) in {wall:.1f} s")
    if args.json_path:
        # the pools the engine sized (from --kv-cache-memory) and the threads and dtype it ran with
        weights: dict[str, int] = {}
        for t in loaded.model.parameters():
            name = str(t.dtype).removeprefix("torch.")
            weights[name] = weights.get(name, 0) + t.numel()
        meta = {**pl.meta, **run_meta("bench", used), "torch_threads": torch.get_num_threads(),
                "weight_dtypes": weights, "parts": [x for x, _ in workloads], "wall_time": wall}
        payload = arms_payload(results, meta)
        for d, a, info in zip(payload["arms"], agreement, handoff_info):
            d["first_token_agreement"] = a
            if info is not None:
                d["handoff_choices"] = info["choices"]
                d["level_prediction"] = info["levels"]
                cost, host = info["cost"], max(d["host_time"], 1e-12)
                d["handoff_level0_equivalent"] = cost["level0_equivalent"]
                d["handoff_marginal_time"] = cost["marginal"]
                d["handoff_gross_share"] = d["handoff_time"] / host
                d["handoff_marginal_share"] = cost["marginal"] / host
                d["handoff_level0_fit"] = info.get("level0_fit")
                d["handoff_fold_calls"] = info["fold_calls"]
                d["handoff_fold_time"] = info["fold_time"]
                d["handoff_fold_share"] = info["fold_time"] / host
                d["handoff_fold_measured"] = info["fold_measured"]
                d["handoff_fold_measured_share"] = info["fold_measured"] / host
                d["handoff_fold_wall"] = info["fold_wall"]
                d["fold_prediction"] = info["fold"]
                # per forward that folded: predicted and measured seconds, calls, rows, rows copied, host clock
                d["fold_log"] = [list(e) for e in info["fold_log"]]
        write_json(args.json_path, payload)
    return 0
