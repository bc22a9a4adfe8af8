"""Serves a model over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

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
    # serve's defaults (docs/server.md "Defaults"): branch checkpoints where the model is hybrid
    p.set_defaults(checkpoints=None)
    for a in p._actions:
        if a.dest == "checkpoints":
            a.help = (a.help or "") + " (serve's default: branch for a hybrid model, boundary for full attention)"
    flags.add(p, "--kv-cache-memory", help=flags.FLAGS["--kv-cache-memory"]["help"] + "; default: the KV pages "
              "5%% of RAM (of free GPU memory) had, and state slots for 4 per row of --max-num-seqs, at most half "
              "the available memory (docs/server.md)")
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
    p.add_argument("--warmup", default="lazy", choices=["lazy", "eager"],
                   help="the engine's warm-up probes (scan chunk costs, the hand-off calibration) and first "
                        "forward: lazy (default) answers /health first and runs them between requests, with "
                        "safe defaults until they finish; eager runs them before /health answers")
    p.add_argument("--probe-cache", type=_probe_cache, default=None,
                   help="directory keeping the warm-up probes' results (keyed by model, CPU, threads, torch and "
                        "code; default: $RADIXFLOW_CACHE/probes); off: probe at every start, keep nothing")
    p.add_argument("--debug-endpoints", action="store_true",
                   help="enable GET /debug/cache (pool integrity and what branches hold)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_security_arguments(p)


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM's names and formats (docs/server.md "Security")."""
    g = p.add_argument_group("security")
    g.add_argument("--api-key", action="extend", nargs="+", default=None, metavar="KEY",
                   help="clients must send 'Authorization: Bearer KEY' on every route but /health, /version "
                        "and /metrics; several keys: repeat the flag, list them after it, or separate them "
                        "with commas (default: the RADIXFLOW_API_KEY variable, comma-separated; none: no key)")
    g.add_argument("--protect-metrics", action="store_true", help="/metrics needs the API key too")
    g.add_argument("--ssl-keyfile", default=None, help="the server's private key (PEM), for HTTPS")
    g.add_argument("--ssl-certfile", default=None, help="the server's certificate chain (PEM), for HTTPS")
    g.add_argument("--ssl-ca-certs", default=None,
                   help="CA certificates (PEM) that client certificates are checked against")
    g.add_argument("--ssl-cert-reqs", type=_cert_reqs, default=0,
                   help="client certificates: 0|none (default), 1|optional, 2|required (the ssl module's CERT_*)")
    g.add_argument("--allowed-origins", type=_json_list("--allowed-origins"), default=[],
                   help='CORS origins, a JSON list as in vLLM (\'["https://app.example"]\', \'["*"]\') or a comma '
                        "list; default: none, no cross-origin browser access")
    g.add_argument("--allowed-methods", type=_json_list("--allowed-methods"), default=["*"],
                   help="CORS methods (JSON list or comma list; default: all)")
    g.add_argument("--allowed-headers", type=_json_list("--allowed-headers"), default=["*"],
                   help="CORS request headers (JSON list or comma list; default: all)")
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies)")
    g.add_argument("--root-path", default="", help="the path prefix a reverse proxy strips (FastAPI's root_path)")
    g.add_argument("--log-requests", "--enable-log-requests", dest="log_requests", action="store_true",
                   help="log each request's prompt and output text (otherwise logs never hold request text)")
    g.add_argument("--max-log-len", type=positive_int, default=None,
                   help="with --log-requests: characters of each prompt or output logged (default: all)")


def _probe_cache(text: str) -> str:
    if text.strip().lower() == "off":
        return "off"
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    return str(path)


def _json_list(flag: str):
    def parse(text: str) -> list[str]:
        if text.lstrip()[:1] in ('[', '{', '"'):  # JSON, as vLLM reads it
            try:
                value = json.loads(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
            value = [value] if isinstance(value, str) else value
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise argparse.ArgumentTypeError(f"{flag} must be a JSON list of strings, got {text!r}")
            return value
        return [v.strip() for v in text.split(",") if v.strip()]  # no origin, method or header has a comma
    return parse


def _cert_reqs(text: str) -> int:
    from radixflow.server.tls import parse_cert_reqs

    try:
        return parse_cert_reqs(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--ssl-cert-reqs: ")) from None


# serve's --tail-checkpoints where branch checkpoints are on and none is given (docs/server.md "Defaults")
TAIL_CHECKPOINTS = 256


def checkpoints_default(model: str) -> str:
    """serve's --checkpoints where none is given: branch for a hybrid model (exact-depth checkpoints at
    every known branch point and prompt end), boundary for full attention (every page already is one)."""
    from radixflow.engine.loader import build_meta
    from radixflow.engine.tiny import config_of

    try:
        return "branch" if build_meta(config_of(model)).is_hybrid else "boundary"
    except (ValueError, TypeError):  # a broken config.json: check_model refuses it, naming the file
        return "boundary"


def engine_config(args, available_memory: int | None = None) -> EngineConfig:
    base = EngineConfig().scheduler
    fixed = {} if args.checkpoints is not None else {"checkpoints": checkpoints_default(args.model)}
    if args.tail_checkpoints is None and fixed.get("checkpoints", args.checkpoints) == "branch":
        fixed["tail_checkpoints"] = TAIL_CHECKPOINTS  # a given one outside branch mode: scheduler_config refuses it
    sched = scheduler_config(args, default_budget=(base.max_num_seqs, base.max_num_batched_tokens), **fixed)
    probe_cache = None if args.probe_cache == "off" else args.probe_cache or str(default_probe_dir())
    return EngineConfig(model=args.model, policy=args.policy, device=args.device, dtype=args.dtype,
                        scheduler=sched, kv_cache_memory=args.kv_cache_memory,
                        max_model_len=args.max_model_len, seed=args.seed, warmup=args.warmup,
                        probe_cache=probe_cache, available_memory=available_memory)


def default_probe_dir() -> Path:
    from radixflow.engine.calibration.store import default_dir

    return default_dir()


def plan(args, available_memory: int | None = None) -> Plan:
    """The engine config `serve` would run and its settings (logged at start-up), without serving."""
    eng = engine_config(args, available_memory)
    meta = run_meta("serve", eng.scheduler, model=eng.model, policies=[eng.policy], device=eng.device, dtype=eng.dtype,
                    torch_threads=args.torch_threads or None, kv_cache_memory=eng.kv_cache_memory,
                    max_model_len=eng.max_model_len, seed=eng.seed, warmup=eng.warmup,
                    probe_cache=eng.probe_cache or "off")
    return Plan(meta, eng.scheduler, eng)


def pools(eng: EngineConfig, path: Path):
    """The pools the engine will build (engine/memory.py `plan_pools`), from the model's config on the
    meta device: no weights read, no memory taken. The memory the default may take is what is available
    now less the weights' bytes (they are not in yet). ValueError if the budget cannot hold one branch."""
    import torch

    from radixflow.engine.engine import _dtype
    from radixflow.engine.loader import build_meta, read_config
    from radixflow.engine.memory import available_memory, plan_pools

    if eng.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {eng.device}: torch sees no CUDA device")
    model = build_meta(read_config(path))
    dtype = _dtype(eng.dtype)
    layout = model.allocate_cache(1, eng.scheduler.block_size, 1, device="meta", dtype=dtype)
    weights = sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()
    free = max(available_memory(torch.device(eng.device)) - weights, 0)
    return plan_pools(eng, torch.device(eng.device), layout.kv_bytes_per_token, layout.state_bytes_per_slot,
                      model.is_hybrid, free), free


def server_config(args, available_memory: int | None = None, **startup):
    from radixflow.server.app import ServerConfig

    return ServerConfig(engine=engine_config(args, available_memory), host=args.host, port=args.port,
                        served_model_name=args.served_model_name, max_queue=args.max_queue,
                        default_max_tokens=args.default_max_tokens, drain_timeout=args.drain_timeout,
                        debug_endpoints=args.debug_endpoints, torch_threads=args.torch_threads or None,
                        max_body_bytes=args.max_body_size, max_branches_per_request=args.max_branches_per_request,
                        **security_fields(args), **startup)


def security_fields(args) -> dict:
    from radixflow.server.auth import ENV_VAR, parse_api_keys

    return dict(api_keys=parse_api_keys(args.api_key, os.environ.get(ENV_VAR)), protect_metrics=args.protect_metrics,
                allowed_origins=tuple(args.allowed_origins), allowed_methods=tuple(args.allowed_methods),
                allowed_headers=tuple(args.allowed_headers), allow_credentials=args.allow_credentials,
                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
                ssl_cert_reqs=args.ssl_cert_reqs, root_path=args.root_path.rstrip("/"),
                log_requests=args.log_requests, max_log_len=args.max_log_len)


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 where it cannot be read)."""
    try:
        start = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def run(args) -> int:
    from radixflow.server.runner import serve
    from radixflow.server.tls import check_tls

    age = process_age()
    started_at = time.monotonic() - age
    phases = [("python, imports (torch, server), flags", age)]
    t0 = time.monotonic()
    server_config(args)  # bad keys fail here, before the port opens
    path = check_model(resolve_model(args.model))  # a bad name, path or file fails here too
    phases.append(("model check: config, weight headers, tokenizer", time.monotonic() - t0))
    t0 = time.monotonic()
    built, free = pools(engine_config(args), path)  # a budget too small for one branch: exit 2 here
    config = server_config(args, free, startup=(), started_at=started_at)
    check_tls(config.ssl_keyfile, config.ssl_certfile, config.ssl_ca_certs, config.ssl_cert_reqs)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = {k: v for k, v in plan(args, free).meta.items() if k not in ("command", "cache_memory_bytes")}
    settings.update(kv_cache_memory=built.budget, kv_cache_memory_source=built.source, num_kv_pages=built.pages,
                    num_state_slots=built.slots, kv_pool_bytes=built.pages * built.page_bytes,
                    state_pool_bytes=built.slots * built.slot_bytes)
    serve_log = logging.getLogger("radixflow.serve")
    serve_log.info("settings: %s", settings)
    if built.warning:
        serve_log.warning(built.warning)
    phases.append(("settings: pools sized, TLS files read", time.monotonic() - t0))
    config.startup, config.startup_mark = tuple(phases), time.monotonic()
    return serve(config, args.log_level)
