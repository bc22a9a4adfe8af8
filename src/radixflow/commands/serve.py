"""Serves a model over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""

from __future__ import annotations

import argparse
import logging
import re

from radixflow.commands.common import add_scheduler_flags, positive_int
from radixflow.config import SchedulerConfig
from radixflow.core.policies import ARMS
from radixflow.engine.engine import EngineConfig
from radixflow.engine.loader import check_model
from radixflow.engine.tiny import resolve_model

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_bytes(text: str) -> int:
    """'268435456', '256MiB', '1.5GiB', '512MB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (examples: 268435456, 256MiB, 2GiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 bytes, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen3.5", help="tiny model name or HF model directory")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--policy", default="radixflow", choices=list(ARMS), help="scheduler arm (SPEC §8)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_scheduler_flags(p)
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                   help="bytes for KV pages and state snapshots (suffixes: KiB MiB GiB, kB MB GB); "
                        "default: a fraction of device memory")
    p.add_argument("--max-model-len", type=positive_int, default=8192, help="longest prompt + max_tokens")
    p.add_argument("--max-queue", type=positive_int, default=1024,
                   help="requests accepted but not yet started; beyond this the server answers 429")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--default-max-tokens", type=positive_int, default=256,
                   help="max_tokens of a chat request that sends none")
    p.add_argument("--drain-timeout", type=non_negative_float, default=60.0,
                   help="on SIGTERM, seconds to let in-flight requests finish; then those still running get an "
                        "error (a stream: an error event) and the process exits")
    p.add_argument("--max-body-size", type=parse_bytes, default=64 << 20,
                   help="largest request body (suffixes as --kv-cache-memory); larger bodies get 413")
    p.add_argument("--max-branches-per-request", type=positive_int, default=1024,
                   help="most sequences (prompts x n) one request may ask for; more get 400")
    p.add_argument("--torch-threads", type=positive_int, default=None,
                   help="intra-op CPU threads of the engine thread (default: torch's; 1 avoids the large "
                        "slowdown of oversubscribed OpenMP when other processes share the cores)")
    p.add_argument("--debug-endpoints", action="store_true",
                   help="enable GET /debug/cache (pool integrity and what branches hold)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_config(args) -> EngineConfig:
    base = EngineConfig().scheduler
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs or base.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens or base.max_num_batched_tokens,
                            block_size=args.block_size, state_interval=args.state_interval,
                            enable_prefix_caching=args.enable_prefix_caching, snapshot_mode=args.snapshot_mode,
                            checkpoints=getattr(args, "checkpoints", "boundary"),
                            checkpoint_wait=getattr(args, "checkpoint_wait", "grid"))
    sched.validate()
    return EngineConfig(model=args.model, policy=args.policy, device=args.device, dtype=args.dtype,
                        scheduler=sched, kv_cache_memory=args.kv_cache_memory,
                        max_model_len=args.max_model_len, seed=args.seed)


def server_config(args):
    from radixflow.server.app import ServerConfig

    return ServerConfig(engine=engine_config(args), host=args.host, port=args.port,
                        served_model_name=args.served_model_name, max_queue=args.max_queue,
                        default_max_tokens=args.default_max_tokens, drain_timeout=args.drain_timeout,
                        debug_endpoints=args.debug_endpoints, torch_threads=args.torch_threads,
                        max_body_bytes=args.max_body_size, max_branches_per_request=args.max_branches_per_request)


def run(args) -> int:
    from radixflow.server.runner import serve

    check_model(resolve_model(args.model))  # a bad name, path or file fails here, before the port opens
    config = server_config(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return serve(config, args.log_level)
