"""`radixflow serve` flags: byte sizes, the engine config they build, and user errors."""

from __future__ import annotations

import argparse

import pytest

from radixflow.cli import main
from radixflow.commands import serve


@pytest.mark.parametrize("text, value", [("268435456", 268435456), ("256MiB", 256 << 20), ("1.5GiB", 3 << 29),
                                         ("512MB", 512_000_000), ("64kib", 64 << 10), ("2G", 2 * 10**9)])
def test_parse_bytes(text, value):
    assert serve.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "12XB", "-5MiB", "0"])
def test_parse_bytes_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        serve.parse_bytes(text)


def test_flags_build_the_engine_config():
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--model", "tiny-qwen3", "--policy", "radix", "--max-num-seqs", "4",
                         "--max-num-batched-tokens", "512", "--block-size", "8", "--state-interval", "64",
                         "--kv-cache-memory", "32MiB", "--max-model-len", "1024", "--max-queue", "7",
                         "--checkpoints", "branch"])
    cfg = serve.engine_config(args)
    assert (cfg.model, cfg.policy, cfg.kv_cache_memory, cfg.max_model_len) == ("tiny-qwen3", "radix", 32 << 20, 1024)
    sc = cfg.scheduler
    assert (sc.max_num_seqs, sc.max_num_batched_tokens, sc.block_size, sc.state_interval) == (4, 512, 8, 64)
    assert sc.checkpoints == "branch"
    assert args.max_queue == 7


def test_user_errors_exit_2(capsys):
    assert main(["serve", "--model", "/no/such/model"]) == 2
    assert "neither a model directory nor a tiny model name" in capsys.readouterr().err
    assert main(["serve", "--model", "tiny-qwen3", "--block-size", "16", "--state-interval", "24"]) == 2
    assert "--state-interval (24) must be a positive multiple of --block-size (16)" in capsys.readouterr().err


def test_serving_flags_reach_the_server_config():
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--snapshot-mode", "chunk-end", "--drain-timeout", "2.5", "--max-body-size", "1MiB",
                         "--max-branches-per-request", "64"])
    cfg = serve.server_config(args)
    assert cfg.engine.scheduler.snapshot_mode == "chunk-end"
    assert (cfg.drain_timeout, cfg.max_body_bytes, cfg.max_branches_per_request) == (2.5, 1 << 20, 64)
    for bad in (["--drain-timeout", "-1"], ["--drain-timeout", "nan"], ["--max-branches-per-request", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
