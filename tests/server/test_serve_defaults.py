"""serve's defaults (docs/server.md "Defaults"): branch checkpoints where the model is hybrid, pools sized so
every row of a round has state slots (or a warning naming the flag), the settings line with the pools the
engine builds, and start-up phases in the log."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from radixflow.cli import main
from radixflow.commands import serve
from radixflow.config import SchedulerConfig
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.memory import ROW_SLOTS, plan_pools
from radixflow.engine.tiny import resolve_model

MiB = 1 << 20


def _args(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(flags))


@pytest.mark.parametrize("model, mode", [("tiny-qwen3.5", "branch"), ("tiny-nemotron-h", "branch"),
                                         ("tiny-qwen3", "boundary"), ("random:qwen3.5-0.8b", "branch"),
                                         ("random:nemotron-h-1b", "branch"), ("random:qwen3-0.6b", "boundary")])
def test_branch_checkpoints_are_the_default_where_the_model_is_hybrid(model, mode):
    assert serve.checkpoints_default(model) == mode  # random: names are read from their configs, not built
    sc = serve.engine_config(_args("--model", model)).scheduler
    assert sc.checkpoints == mode
    # tail checkpoints come with branch mode (docs/server.md "Defaults"); nothing where there is no state
    assert sc.tail_checkpoints == (serve.TAIL_CHECKPOINTS if mode == "branch" else 0)


def test_a_given_checkpoint_mode_wins_and_checkpoint_wait_needs_branch():
    assert serve.engine_config(_args("--model", "tiny-qwen3.5", "--checkpoints", "boundary")).scheduler.checkpoints \
        == "boundary"
    assert serve.engine_config(_args("--model", "tiny-qwen3", "--checkpoints", "branch")).scheduler.checkpoints \
        == "branch"
    # a hybrid model's default is branch, so its wait rule is honoured; full attention refuses it (exit 2)
    assert main(["serve", "--model", "tiny-qwen3", "--checkpoint-wait", "64", "--port", "1"]) == 2
    # the same for the tail window: a given one is kept, refused where the mode is not branch
    given = serve.engine_config(_args("--model", "tiny-qwen3.5", "--tail-checkpoints", "0"))
    assert given.scheduler.tail_checkpoints == 0
    assert main(["serve", "--model", "tiny-qwen3.5", "--checkpoints", "boundary", "--tail-checkpoints", "128",
                 "--port", "1"]) == 2


def _engine_config(st_max_seqs: int = 16, kv: int | None = None) -> EngineConfig:
    return EngineConfig(scheduler=SchedulerConfig(max_num_seqs=st_max_seqs, max_num_batched_tokens=2048,
                                                  block_size=16, state_interval=512), kv_cache_memory=kv)


QWEN35_08B = (24576, 20201472)  # KV bytes per token and state bytes per slot of random:qwen3.5-0.8b in fp32


def test_default_pools_give_every_row_its_state_slots():
    kv_tok, st = QWEN35_08B
    plan = plan_pools(_engine_config(), torch.device("cpu"), kv_tok, st, True, available=16 << 30)
    assert plan.slots >= ROW_SLOTS * 16 and plan.warning is None
    assert plan.source.startswith("default")
    # the KV pages keep what the old default gave them (70% of 5% of RAM)
    old_pages, _ = (int(plan.pages), 0)
    assert old_pages * 16 * kv_tok >= 0.6 * 0.05 * _ram()


def test_default_pools_capped_by_free_memory_warn_naming_the_flag():
    kv_tok, st = QWEN35_08B
    plan = plan_pools(_engine_config(), torch.device("cpu"), kv_tok, st, True, available=1 << 30)
    assert plan.budget <= 512 * MiB and plan.slots < 32
    assert "--kv-cache-memory" in plan.warning and "--max-num-seqs" in plan.warning
    assert "capped at half the available memory" in plan.source


def test_a_given_budget_is_honoured_as_before():
    kv_tok, st = QWEN35_08B
    plan = plan_pools(_engine_config(kv=1205 * MiB), torch.device("cpu"), kv_tok, st, True, available=16 << 30)
    assert (plan.budget, plan.source) == (1205 * MiB, "--kv-cache-memory")
    assert plan.slots == int(1205 * MiB * 0.3) // st  # 18: the figure
    assert "--kv-cache-memory" in plan.warning


def _ram() -> int:
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-qwen3"])
def test_the_settings_pools_are_the_ones_the_engine_builds(model):
    args = _args("--model", model, "--probe-cache", "off")
    planned, free = serve.pools(serve.engine_config(args), resolve_model(model))
    eng = Engine(serve.engine_config(args, free))
    assert (eng.pools.pages, eng.pools.slots, eng.pools.budget) == (planned.pages, planned.slots, planned.budget)
    assert eng.cache.num_pages == planned.pages
    assert eng.cache.num_state_slots == (planned.slots if eng.loaded.model.is_hybrid else 0)
    assert eng.scheduler_config.num_kv_pages == planned.pages


def test_a_budget_too_small_for_one_branch_exits_2_before_the_port_opens(capsys):
    assert main(["serve", "--model", "tiny-qwen3.5", "--kv-cache-memory", "64KiB", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raise --kv-cache-memory or lower --max-model-len" in err


def test_the_start_up_log_names_each_phase_and_the_built_pools(caplog):
    from radixflow.server.app import ServerConfig, ServerState

    args = _args("--model", "tiny-qwen3.5", "--probe-cache", "off", "--kv-cache-memory", "32MiB")
    config = ServerConfig(engine=serve.engine_config(args), startup=(("model check", 0.5),), started_at=None,
                          startup_mark=None)
    state = ServerState(config)
    with caplog.at_level(logging.INFO, logger="radixflow.server"):
        state.loop.start()
        assert state.loop.ready.wait(120)
        state.loop.stop()
    text = caplog.text
    for phase in ("model check", "load weights", "allocate and touch KV pages and state slots", "probes (scan pending"):
        assert f"start-up: {phase}" in text
    pools = state.loop.engine.pools
    assert f"pools built: {pools.pages} KV pages" in text and f"{pools.slots} state slots" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a CUDA device torch cannot see")
def test_a_cuda_device_torch_cannot_see_exits_2_before_the_port_opens(capsys):
    assert main(["serve", "--model", "tiny-qwen3.5", "--device", "cuda", "--port", "1"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_the_warm_up_flags_reach_the_engine(tmp_path):
    cfg = serve.engine_config(_args("--model", "tiny-qwen3.5", "--warmup", "eager", "--probe-cache", str(tmp_path)))
    assert (cfg.warmup, cfg.probe_cache) == ("eager", str(tmp_path))
    cfg = serve.engine_config(_args("--model", "tiny-qwen3.5", "--probe-cache", "off"))
    assert (cfg.warmup, cfg.probe_cache) == ("lazy", None)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        _args("--probe-cache", str(tmp_path / "file"))
