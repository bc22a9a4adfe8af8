"""Which SGLang the backends are written against, checked without importing SGLang.

The backends replace the FULL component's eviction walk of SGLang's `UnifiedRadixCache` and call its
tree core's private `_split_node`; their meaning is only known for the version they were read from,
so any other version is refused up front, in one line, instead of misbehaving mid-serve.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_SGLANG_VERSION = "0.5.23"


class UnsupportedSglangError(ImportError):
    """SGLang is missing, or is a version the backends were not written against."""


def installed_sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def require_supported_sglang() -> str:
    """Return the installed SGLang version, or raise `UnsupportedSglangError` saying what to install."""
    installed = installed_sglang_version()
    if installed is None:
        raise UnsupportedSglangError(
            f"radixflow.integrations.sglang needs SGLang {SUPPORTED_SGLANG_VERSION}, but SGLang is not installed; "
            f"install it with `pip install 'radixflow[sglang]'` (or `bash scripts/install_sglang.sh` for CPU tests)")
    if installed.split("+", 1)[0] != SUPPORTED_SGLANG_VERSION:
        raise UnsupportedSglangError(
            f"radixflow.integrations.sglang supports SGLang {SUPPORTED_SGLANG_VERSION} only; SGLang {installed} is "
            f"installed (install sglang=={SUPPORTED_SGLANG_VERSION}, or drop --radix-cache-backend radixflow-*)")
    return installed


def refusal(*, hicache: bool, kv_shards: int, int8_mamba: bool, session_refs: bool) -> str | None:
    """Why a radixflow backend cannot honour this cache configuration (None: it can).

    HiCache (device leaves demoted to host), logical-page KV sharding (a page's owner rank rotates
    along the chain) and int8 Mamba checkpoints (states stored quantised) change what a node holds in
    ways the tail walk does not model; session references reorder SGLang's own walks by session."""
    if hicache:
        return "HiCache (--enable-hierarchical-cache) is not supported: tail cuts assume device-only nodes"
    if kv_shards > 1:
        return f"logical-page KV sharding (shard size {kv_shards}) is not supported: a cut would split a rotation"
    if int8_mamba:
        return "int8 Mamba checkpoints (--enable-int8-mamba-checkpoint) are not supported"
    if session_refs:
        return "--enable-session-radix-cache is not supported: the walk does not read session references"
    return None
