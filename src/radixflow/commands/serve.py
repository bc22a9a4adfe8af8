"""Serves a model over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""

from __future__ import annotations

import argparse
import json
import logging
import os

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
                        max_body_bytes=args.max_body_size, max_branches_per_request=args.max_branches_per_request,
                        **security_fields(args))


def security_fields(args) -> dict:
    from radixflow.server.auth import ENV_VAR, parse_api_keys

    return dict(api_keys=parse_api_keys(args.api_key, os.environ.get(ENV_VAR)), protect_metrics=args.protect_metrics,
                allowed_origins=tuple(args.allowed_origins), allowed_methods=tuple(args.allowed_methods),
                allowed_headers=tuple(args.allowed_headers), allow_credentials=args.allow_credentials,
                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
                ssl_cert_reqs=args.ssl_cert_reqs, root_path=args.root_path.rstrip("/"),
                log_requests=args.log_requests, max_log_len=args.max_log_len)


def run(args) -> int:
    from radixflow.server.runner import serve
    from radixflow.server.tls import check_tls

    config = server_config(args)  # bad keys fail here, before the port opens
    check_tls(config.ssl_keyfile, config.ssl_certfile, config.ssl_ca_certs, config.ssl_cert_reqs)
    check_model(resolve_model(args.model))  # a bad name, path or file fails here too
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = {k: v for k, v in plan(args).meta.items() if k != "command"}
    logging.getLogger("radixflow.serve").info("settings: %s", settings)
    return serve(config, args.log_level)
