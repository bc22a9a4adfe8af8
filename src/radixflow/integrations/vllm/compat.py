"""Which vLLM the plugin is written against, checked without importing vLLM.

The plugin hooks two private methods of vLLM's `Scheduler`; their meaning is only known for the version
it was read from, so any other version is refused up front instead of misbehaving mid-serve.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_VLLM_VERSION = "0.33.0"


class UnsupportedVllmError(ImportError):
    """vLLM is missing, or is a version the plugin was not written against."""


class UnsupportedSpeculativeConfigError(ValueError):
    """A speculative-decoding config whose scheduling the plugin's claim does not model."""


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None when it is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def require_supported_vllm() -> str:
    """Return the installed vLLM version, or raise `UnsupportedVllmError` saying what to install."""
    installed = installed_vllm_version()
    if installed is None:
        raise UnsupportedVllmError(
            f"radixflow.integrations.vllm needs vLLM {SUPPORTED_VLLM_VERSION}, but vLLM is not installed. "
            f"Install it with `pip install 'radixflow[vllm]'` (or `bash scripts/install_vllm.sh PYTHON` "
            "for a CPU-only test environment)."
        )
    # Local build tags (`0.33.0+cu130`, `0.33.0+cpu`) are the same scheduler source.
    if installed.split("+", 1)[0] != SUPPORTED_VLLM_VERSION:
        raise UnsupportedVllmError(
            f"radixflow.integrations.vllm supports vLLM {SUPPORTED_VLLM_VERSION} only; vLLM {installed} is "
            f"installed. Install vllm=={SUPPORTED_VLLM_VERSION}, or run without --scheduler-cls."
        )
    return installed
