"""Every subcommand's shared flags, walked from `radixflow`'s own parser: a good value reaches the
config the command builds (its `plan(args)`, read back from the SchedulerConfig / EngineConfig and
from the results' meta), a bad one exits 2 naming the flag, and a flag a workload cannot honour is
refused. A new subcommand or a new shared flag on one is walked without touching this file."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import pytest

from radixflow.cli import main, make_parser


@dataclass(frozen=True)
class Shared:
    goods: tuple[str, ...]  # candidates: the first the parser accepts that is not its default is used
    bad: str | None  # a value the flag must refuse at parse time (None: a switch)
    meta: str  # the meta key that records it (the results JSON)
    sched: str | None = None  # the SchedulerConfig field it sets
    engine: str | None = None  # the EngineConfig field it sets
    expect: object = None  # the value read back (None: the good value, typed as given)
    extra: tuple[str, ...] = ()  # other flags it needs to be meaningful


SHARED = {
    "dtype": Shared(("fp16",), "nonsense", "dtype", engine="dtype", expect="float16"),
    "device": Shared(("cuda:1",), "tpu", "device", engine="device"),
    "model": Shared(("tiny-qwen3", "qwen3.5-4b"), "gpt-9", "model", engine="model"),
    "seed": Shared(("7",), "-1", "seed", engine="seed", expect=7),
    "kv_cache_memory": Shared(("32MiB",), "lots", "kv_cache_memory", engine="kv_cache_memory", expect=32 << 20),
    "max_model_len": Shared(("1024",), "0", "max_model_len", engine="max_model_len", expect=1024),
    "torch_threads": Shared(("3",), "-1", "torch_threads", expect=3),
    "max_num_seqs": Shared(("7",), "0", "max_num_seqs", sched="max_num_seqs", expect=7),
    "max_num_batched_tokens": Shared(("4096",), "many", "max_num_batched_tokens", sched="max_num_batched_tokens",
                                     expect=4096),
    "block_size": Shared(("8",), "-16", "block_size", sched="block_size", expect=8),
    "state_interval": Shared(("1024",), "0", "state_interval", sched="state_interval", expect=1024),
    "snapshot_mode": Shared(("chunk-end",), "sometimes", "snapshot_mode", sched="snapshot_mode"),
    "checkpoints": Shared(("branch",), "everywhere", "checkpoints", sched="checkpoints"),
    "checkpoint_wait": Shared(("64",), "sometimes", "checkpoint_wait", sched="checkpoint_wait",
                              extra=("--checkpoints", "branch")),
    "handoff": Shared(("on", "off"), "maybe", "handoff", sched="handoff"),  # trace: off alone
    "handoff_max_levels": Shared(("3",), "0", "handoff_max_levels", sched="handoff_max_levels", expect=3,
                                 extra=("--handoff", "on")),
    "eviction": Shared(("flop-aware",), "fifo", "eviction", sched="eviction"),
    "prefix_match_unit": Shared(("16",), "-1", "prefix_match_unit", sched="prefix_match_unit", expect=16,
                                extra=("--snapshot-mode", "vllm-align")),
    "vllm_version": Shared(("0.29",), "0.1", "vllm_version", sched="vllm_version",
                           extra=("--snapshot-mode", "vllm-align")),
    "enable_prefix_caching": Shared(("--no-prefix-caching",), None, "enable_prefix_caching",
                                    sched="enable_prefix_caching", expect=False),
    "gpu": Shared(("h100",), "tpu9", "gpu"),
    "gpu_memory_utilization": Shared(("0.5",), "1.5", "gpu_memory_utilization", expect=0.5),
    "state_memory_fraction": Shared(("0.25",), "2", "state_memory_fraction", expect=0.25),
    "policy": Shared(("radix",), "nope", "policies", expect=["radix"]),
    "stream": Shared(("cold",), "hot", "stream"),
    "order": Shared(("reverse", "forward"), "sideways", "order"),
    "questions": Shared(("5",), "0", "questions", expect=5),
    "rate": Shared(("2.5",), "-1", "rate", expect=2.5),
    "branch_gap": Shared(("0.01",), "-1", "branch_gap", expect=0.01),
    "article_scale": Shared(("0.5",), "-2", "article_scale", expect=0.5),
    "models": Shared(("qwen3-8b",), "gpt-9", "models", expect=["qwen3-8b"]),
    "arms": Shared(("radix",), "fastest", "arms", expect=["radix"]),
    "streams": Shared(("cold",), "hot", "streams", expect=["cold"]),
    "orders": Shared(("forward",), "sideways", "orders", expect=["forward"]),
}


def _commands():
    parser, modules = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(modules) and len(modules) >= 6  # every command was loaded and walked
    return [(name, p, modules[name]) for name, p in sub.choices.items()]


COMMANDS = _commands()


def _base(p: argparse.ArgumentParser, tmp) -> list[str]:
    """The least argv this parser accepts: its positionals and required options filled in."""
    argv = []
    for a in p._actions:
        if not a.option_strings and a.dest != "help":
            argv.append(a.choices[0] if a.choices else str(tmp))
        elif a.required:
            argv += [a.option_strings[0], str(tmp)]
    return argv


def _option(p: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    for a in p._actions:
        if a.dest == dest and a.option_strings:
            return a
    return None


def _cases():
    out = []
    for name, p, _ in COMMANDS:
        dests = {a.dest for a in p._actions if a.option_strings}
        out += [pytest.param(name, dest, id=f"{name}-{dest}") for dest in sorted(dests & set(SHARED))]
    return out


CASES = _cases()


def test_the_walk_finds_the_shared_flags_of_every_command():
    found = {(c.values[0], c.values[1]) for c in CASES}
    for name, dest in [("bench", "dtype"), ("serve", "dtype"), ("bench", "device"), ("serve", "handoff"),
                       ("simulate", "handoff"), ("simulate", "eviction"), ("experiment", "handoff"),
                       ("experiment", "checkpoint_wait"), ("trace", "checkpoints"), ("simulate", "seed")]:
        assert (name, dest) in found


@pytest.mark.parametrize("name,dest", CASES)
def test_a_good_value_reaches_what_it_configures(name, dest, tmp_path):
    _, p, mod = next(c for c in COMMANDS if c[0] == name)
    spec, action = SHARED[dest], _option(p, dest)
    base = _base(p, tmp_path)
    default = p.parse_args(base).__dict__[dest]
    for good in spec.goods:
        argv = [*base, *spec.extra, good] if action.nargs == 0 else [*base, *spec.extra, action.option_strings[0], good]
        try:
            args = p.parse_args(argv)
        except SystemExit:
            continue
        if getattr(args, dest) != default:
            break
    else:
        pytest.fail(f"{name}: no good value of {dest} in {spec.goods} differs from the default {default!r}")
    expect = good if spec.expect is None else spec.expect
    assert hasattr(mod, "plan"), f"radixflow {name} has shared flags but no plan(args)"
    plan = mod.plan(args)
    assert plan.meta[spec.meta] == expect, f"{name} {argv}: meta[{spec.meta!r}] = {plan.meta[spec.meta]!r}"
    if spec.sched and plan.scheduler is not None:
        assert getattr(plan.scheduler, spec.sched) == expect
    if spec.engine and plan.engine is not None:
        assert getattr(plan.engine, spec.engine) == expect
        if plan.scheduler is not None:
            assert plan.engine.scheduler is plan.scheduler
    assert plan.meta["versions"]["radixflow"] and "torch" in plan.meta["versions"] and "vllm" in plan.meta["versions"]


def _refused(argv: list[str], capsys) -> str:
    """The one error line for argv: argparse's (exit 2) or plan(args)'s ValueError (exit 2 in main);
    nothing is run, so a flag that is wrongly accepted fails here at once."""
    parser, modules = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]
    with pytest.raises(ValueError) as e:
        modules[argv[0]].plan(args)
    return str(e.value)


@pytest.mark.parametrize("name,dest", [c for c in CASES if SHARED[c.values[1]].bad is not None])
def test_a_bad_value_exits_2_naming_the_flag(name, dest, tmp_path, capsys):
    _, p, _ = next(c for c in COMMANDS if c[0] == name)
    flag = _option(p, dest).option_strings[-1]
    assert f"argument {flag}" in _refused([name, *_base(p, tmp_path), flag, SHARED[dest].bad], capsys)


def test_bench_dtype_nonsense_exits_2(capsys):
    # cheap flags beside it: a build that accepted the dtype would run only this small bench
    assert main(["bench", "--dtype", "nonsense", "--questions", "2", "--article-scale", "0.02", "--stream", "cold",
                 "--policy", "radix"]) == 2
    assert "argument --dtype: unknown dtype 'nonsense'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [
    (["simulate", "--workload", "figure1", "--agents", "3"], "--agents"),
    (["simulate", "--workload", "figure1", "--cache-capacity", "24x"], "--cache-capacity"),
    (["simulate", "--workload", "figure1", "--stream", "cold"], "--stream"),
    (["simulate", "--workload", "figure1", "--eviction", "lru,rr-tail"], "--eviction"),
    (["simulate", "--tokenizer", "tok.json"], "--tokenizer"),
    (["simulate", "--workload", "figure1", "--scheduler", "vllm", "--handoff", "on"], "--handoff"),
    (["simulate", "--workload", "agentic", "--questions", "4"], "--questions"),
    (["simulate", "--workload", "agentic", "--rate", "3"], "--rate"),
    (["simulate", "--workload", "agentic", "--users", "3"], "--users"),
    (["simulate", "--workload", "multi-turn", "--agents", "3"], "--agents"),
    (["simulate", "--workload", "multi-turn", "--scheduler", "vllm"], "--scheduler"),
    (["simulate", "--workload", "multi-turn", "--policy", "radix,radixflow"], "--policy"),
    (["simulate", "--workload", "multi-turn", "--cache-capacity", "24x", "--gpu-memory-utilization", "0.5"],
     "--gpu-memory-utilization"),
    (["simulate", "--checkpoint-wait", "64"], "--checkpoint-wait"),
    (["simulate", "--tail-checkpoints", "64"], "--tail-checkpoints"),
    (["bench", "--tail-checkpoints", "64"], "--tail-checkpoints"),
    (["simulate", "--handoff", "off", "--handoff-max-levels", "3"], "--handoff-max-levels"),
    (["simulate", "--workload", "figure1", "--handoff-max-levels", "3"], "--handoff-max-levels"),  # figure1: off
    (["simulate", "--scheduler", "vllm", "--handoff-max-levels", "3"], "--handoff-max-levels"),  # vLLM: off
    (["simulate", "--scheduler", "vllm", "--handoff", "auto"], "--handoff"),
    (["simulate", "--snapshot-mode", "vllm-align", "--block-size", "32"], "--block-size"),
    (["simulate", "--workload", "multi-turn", "--snapshot-mode", "vllm-align", "--state-interval", "1024"],
     "--state-interval"),
    (["simulate", "--scheduler", "vllm", "--eviction", "flop-aware"], "--eviction"),
    (["simulate", "--scheduler", "vllm", "--snapshot-mode", "chunk-end"], "--snapshot-mode"),
    (["simulate", "--scheduler", "vllm", "--state-interval", "1024"], "--state-interval"),
    (["serve", "--handoff", "off", "--handoff-max-levels", "3"], "--handoff-max-levels"),
    (["bench", "--checkpoint-wait", "64"], "--checkpoint-wait"),
    (["experiment", "--out", "x", "--checkpoint-wait", "64"], "--checkpoint-wait"),
    (["experiment", "--out", "x", "--handoff-max-levels", "3"], "--handoff-max-levels"),
    (["bench", "--workload", "figure1", "--order", "reverse"], "--order"),
    (["bench", "--workload", "agentic"], "--workload"),
    (["experiment", "--out", "x", "--scheduler", "vllm", "--handoff", "auto"], "--handoff"),
])
def test_a_flag_the_workload_cannot_honour_is_refused(argv, flag, capsys):
    assert flag in _refused(argv, capsys)


def test_a_refusal_exits_2_in_one_line(capsys):
    assert main(["simulate", "--workload", "figure1", "--agents", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["radixflow simulate: error: --agents 3: a flag of --workload agentic | multi-turn, not of figure1"]


def test_session_workloads_pass_every_scheduler_flag_to_the_scheduler():
    _, p, mod = next(c for c in COMMANDS if c[0] == "simulate")
    args = p.parse_args(["--workload", "multi-turn", "--checkpoints", "branch", "--snapshot-mode", "chunk-end",
                         "--handoff", "on", "--handoff-max-levels", "3", "--checkpoint-wait", "64",
                         "--policy", "radixflow", "--no-prefix-caching"])
    plan = mod.plan(args)
    sc = plan.scheduler
    assert (sc.checkpoints, sc.snapshot_mode, sc.handoff, sc.handoff_max_levels, sc.checkpoint_wait) == (
        "branch", "chunk-end", "on", 3, "64")
    assert sc.enable_prefix_caching is False and plan.extra["arm"] == "radixflow"
    assert plan.meta["checkpoints"] == "branch" and plan.meta["evictions"] == ["lru", "rr-tail"]


def test_branch_checkpoints_change_a_multi_turn_run(tmp_path):
    """They used to be dropped there: boundary and branch gave the same hit rate."""
    hits = {}
    for mode in ("boundary", "branch"):
        out = tmp_path / f"{mode}.json"
        assert main(["simulate", "--workload", "multi-turn", "--model", "qwen3.5-0.8b", "--users", "2", "--turns",
                     "3", "--eviction", "lru", "--checkpoints", mode, "--check", "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["meta"]["checkpoints"] == mode
        hits[mode] = data["policies"][0]["hit_rate"]
    assert hits["branch"] > hits["boundary"]


def test_simulate_agentic_runs_adaptive_beside_lru(tmp_path):
    """`adaptive` is a policy name like the others (issue #42): the agentic workload runs it beside lru."""
    out = tmp_path / "adaptive.json"
    assert main(["simulate", "--workload", "agentic", "--model", "qwen3-8b", "--agents", "6", "--calls", "4",
                 "--eviction", "lru,adaptive", "--cache-capacity", "3x", "--check", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["policies"]
    assert [r["eviction"] for r in rows] == ["lru", "adaptive"] and rows[1]["calls"] == rows[0]["calls"] > 0


@pytest.mark.parametrize("dtype,name", [("float16", "float16"), ("bf16", "bfloat16")])
def test_bench_runs_in_the_dtype_asked_and_meta_says_so(tmp_path, dtype, name):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny-qwen3", "--dtype", dtype, "--policy", "radix", "--questions", "2",
                 "--article-scale", "0.02", "--stream", "cold", "--max-model-len", "512",
                 "--kv-cache-memory", "16MiB", "--json", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["dtype"] == name and set(meta["weight_dtypes"]) == {name}
    for key in ("device", "torch_threads", "snapshot_mode", "checkpoints", "checkpoint_wait", "eviction", "handoff",
                "handoff_max_levels", "max_num_seqs", "max_num_batched_tokens", "block_size", "state_interval",
                "num_kv_pages", "kv_cache_memory", "seed"):
        assert key in meta, key
    assert meta["torch_threads"] == 1 and meta["num_kv_pages"] > 0
    assert set(meta["versions"]) >= {"radixflow", "torch", "vllm"}


def test_simulate_meta_records_the_settings_used(tmp_path):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--workload", "figure1", "--policy", "radix", "--checkpoints", "branch", "--handoff",
                 "on", "--eviction", "rr-tail", "--seed", "3", "--json", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert (meta["checkpoints"], meta["handoff"], meta["eviction"], meta["seed"]) == ("branch", "on", "rr-tail", 3)
    assert meta["num_kv_pages"] > 0 and meta["gpu"] == "a800" and "dtype" not in meta


def test_serve_builds_its_engine_in_the_dtype_asked():
    from radixflow.engine.engine import Engine

    _, p, mod = next(c for c in COMMANDS if c[0] == "serve")
    cfg = mod.engine_config(p.parse_args(["--model", "tiny-qwen3", "--dtype", "fp16", "--kv-cache-memory", "8MiB",
                                          "--max-model-len", "256", "--eviction", "rr-tail"]))
    eng = Engine(cfg)
    assert {t.dtype for t in eng.loaded.model.parameters()} == {__import__("torch").float16}
    assert eng.scheduler_config.eviction == "rr-tail"
