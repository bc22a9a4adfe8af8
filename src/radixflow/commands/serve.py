"""Serves a model over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""

from __future__ import annotations

import argparse
import logging

from radixflow.commands import flags
from radixflow.commands.common import Plan, add_scheduler_flags, positive_int, run_meta, scheduler_config
from radixflow.core.policies import ARMS
from radixflow.engine.engine import EngineConfig
from radixflow.engine.loader import check_model
from radixflow.engine.tiny import resolve_model

parse_bytes = flags.byte_size
non_negative_float = flags.non_negative_float


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=flags.engine_model, default="tiny-qwen3.5",
                   help="tiny model name or HF model directory")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--policy", default="radixflow", choices=list(ARMS), help="scheduler arm (SPEC §8)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_scheduler_flags(p)
    flags.add(p, "--kv-cache-memory", help=flags.FLAGS["--kv-cache-memory"]["help"] + "; default: a fraction of "
                                                                                     "device memory")
    flags.add(p, "--max-model-len")
    p.add_argument("--max-queue", type=positive_int, default=1024,
                   help="requests accepted but not yet started; beyond this the server answers 429")
    flags.add(p, "--device", "--dtype", "--seed")
    p.add_argument("--default-max-tokens", type=positive_int, default=256,
                   help="max_tokens of a chat request that sends none")
    p.add_argument("--drain-timeout", type=non_negative_float, default=60.0,
                   help="on SIGTERM, seconds to let in-flight requests finish; then those still running get an "
                        "error (a stream: an error event) and the process exits")
    p.add_argument("--max-body-size", type=parse_bytes, default=64 << 20,
                   help="largest request body (suffixes as --kv-cache-memory); larger bodies get 413")
    p.add_argument("--max-branches-per-request", type=positive_int, default=1024,
                   help="most sequences (prompts x n) one request may ask for; more get 400")
    flags.add(p, "--torch-threads",
              help="intra-op CPU threads of the engine thread (0 or unset: torch's; 1 avoids the large "
                   "slowdown of oversubscribed OpenMP when other processes share the cores)")
    p.add_argument("--debug-endpoints", action="store_true",
                   help="enable GET /debug/cache (pool integrity and what branches hold)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_config(args) -> EngineConfig:
    base = EngineConfig().scheduler
    sched = scheduler_config(args, default_budget=(base.max_num_seqs, base.max_num_batched_tokens))
    return EngineConfig(model=args.model, policy=args.policy, device=args.device, dtype=args.dtype,
                        scheduler=sched, kv_cache_memory=args.kv_cache_memory,
                        max_model_len=args.max_model_len, seed=args.seed)


def plan(args) -> Plan:
    """The engine config `serve` would run and its settings (logged at start-up), without serving."""
    eng = engine_config(args)
    meta = run_meta("serve", eng.scheduler, model=eng.model, policies=[eng.policy], device=eng.device, dtype=eng.dtype,
                    torch_threads=args.torch_threads or None, kv_cache_memory=eng.kv_cache_memory,
                    max_model_len=eng.max_model_len, seed=eng.seed)
    return Plan(meta, eng.scheduler, eng)


def server_config(args):
    from radixflow.server.app import ServerConfig

    return ServerConfig(engine=engine_config(args), host=args.host, port=args.port,
                        served_model_name=args.served_model_name, max_queue=args.max_queue,
                        default_max_tokens=args.default_max_tokens, drain_timeout=args.drain_timeout,
                        debug_endpoints=args.debug_endpoints, torch_threads=args.torch_threads or None,
                        max_body_bytes=args.max_body_size, max_branches_per_request=args.max_branches_per_request)


def run(args) -> int:
    from radixflow.server.runner import serve

    check_model(resolve_model(args.model))  # a bad name, path or file fails here, before the port opens
    config = server_config(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = {k: v for k, v in plan(args).meta.items() if k != "command"}
    logging.getLogger("radixflow.serve").info("settings: %s", settings)
    return serve(config, args.log_level)
