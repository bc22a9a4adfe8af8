"""radixflow's eviction as SGLang radix-cache backends: `radixflow-rr-tail`, `radixflow-level-tail`,
`radixflow-flop-aware`, `radixflow-adaptive` (lru's own walk, or tail cuts while recency's ghost says
it loses whole histories).

    pip install 'radixflow[sglang]'
    python -m sglang.launch_server --model-path MODEL --radix-cache-backend radixflow-level-tail

SGLang loads the `sglang.srt.plugins` entry point `radixflow` (pyproject.toml) in every process
before it parses arguments; `register()` then calls SGLang's `register_radix_cache_backend` for the
four names. Each factory builds SGLang's own `UnifiedRadixCache` (`create_unified_radix_cache`) on
the Python tree core with one change: the FULL component's victim choice is our policy's page walk
(`backend.py`). Importing this package does not import SGLang. See docs/sglang.md.
`python -m radixflow.integrations.sglang` loads SGLang's plugins and prints the registered backends.
"""

from __future__ import annotations

from radixflow.integrations.sglang.compat import (
    SUPPORTED_SGLANG_VERSION,
    UnsupportedSglangError,
    installed_sglang_version,
    refusal,
    require_supported_sglang,
)

__all__ = ["BACKENDS", "BACKEND_NAMES", "SUPPORTED_SGLANG_VERSION", "UnsupportedSglangError", "build_cache",
           "installed_sglang_version", "register", "require_supported_sglang"]

# --radix-cache-backend name -> cache/eviction policy (adaptive: adaptive.DuelFullComponent)
BACKENDS = {"radixflow-rr-tail": "rr-tail", "radixflow-level-tail": "level-tail",
            "radixflow-flop-aware": "flop-aware", "radixflow-adaptive": "adaptive"}
BACKEND_NAMES = tuple(BACKENDS)


def _check(ctx) -> None:
    from sglang.srt.mem_cache.allocator.page_interleave import page_interleave_shard_size
    from sglang.srt.runtime_context import get_memory

    params = ctx.params
    why = refusal(
        hicache=bool(ctx.enable_hierarchical_cache or get_memory().enable_unified_cache_external_linker
                     or get_memory().enable_lmcache),
        kv_shards=page_interleave_shard_size(params.token_to_kv_pool_allocator),
        int8_mamba=bool(getattr(ctx.server_args, "enable_int8_mamba_checkpoint", False)),
        session_refs=bool(params.enable_session_radix_cache))
    if why:
        raise ValueError(f"--radix-cache-backend radixflow-*: {why}")


def build_cache(params, kind: str):
    """A `UnifiedRadixCache` for `params` (tree_components set) whose FULL eviction runs policy `kind`
    (`rr-tail`, `level-tail`, `flop-aware`, `adaptive`) on the Python tree core."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from radixflow.integrations.sglang.components import component_class

    if params.enable_session_radix_cache:
        why = refusal(hicache=False, kv_shards=1, int8_mamba=False, session_refs=True)
        raise ValueError(f"radixflow-{kind}: {why}")
    params.component_registry_override = {**(params.component_registry_override or {}),
                                          ComponentType.FULL: component_class(kind)}
    params.tree_core_backend = "python"
    return UnifiedRadixCache(params)


def _factory(kind: str):
    def factory(ctx):
        from sglang.srt.mem_cache.registry import create_unified_radix_cache
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        from radixflow.integrations.sglang.components import component_class

        _check(ctx)
        ctx.params.component_registry_override = {**(ctx.params.component_registry_override or {}),
                                                  ComponentType.FULL: component_class(kind)}
        ctx.params.tree_core_backend = "python"  # the walk reads Python nodes
        return create_unified_radix_cache(ctx)

    factory.__name__ = f"radixflow_{kind.replace('-', '_')}_factory"
    return factory


def _refuse(error: Exception):
    def factory(ctx):
        raise error

    factory.__name__ = "radixflow_unsupported_sglang_factory"
    return factory


def register() -> list[str]:
    """The `sglang.srt.plugins` entry point: registers the four backends (idempotent).

    On another SGLang version the names are still registered, so that selecting one fails with our
    one line naming the supported version (SGLang would otherwise say the name is unknown); a line is
    logged, and nothing else changes. Without SGLang's registry nothing is registered."""
    import logging

    log = logging.getLogger("radixflow.integrations.sglang")
    try:
        require_supported_sglang()
        wrong = None
    except UnsupportedSglangError as e:
        wrong = e
    try:
        from sglang.srt.mem_cache.registry import register_radix_cache_backend, registered_radix_cache_backends
    except ImportError:
        log.error("%s", wrong or "radixflow: SGLang has no radix-cache backend registry")
        return []
    if wrong is not None:
        log.warning("%s", wrong)
    have = set(registered_radix_cache_backends())
    for name, kind in BACKENDS.items():
        if name not in have:
            register_radix_cache_backend(name, _factory(kind) if wrong is None else _refuse(wrong))
    return list(BACKENDS)
