"""State-ready traversal for vLLM, loaded through `--scheduler-cls`.

    vllm serve MODEL --enable-prefix-caching \\
        --scheduler-cls radixflow.integrations.vllm.StateReadyAsyncScheduler

Importing this package does not import vLLM: the scheduler classes are built on first access, after
the installed vLLM version has been checked (`compat.require_supported_vllm`). See docs/vllm.md.
"""

from __future__ import annotations

from typing import Any

from radixflow.integrations.vllm.compat import (
    SUPPORTED_VLLM_VERSION,
    UnsupportedSpeculativeConfigError,
    UnsupportedVllmError,
    installed_vllm_version,
    require_supported_vllm,
)

__all__ = [
    "SUPPORTED_VLLM_VERSION",
    "StateReadyAsyncScheduler",
    "StateReadyScheduler",
    "UnsupportedSpeculativeConfigError",
    "UnsupportedVllmError",
    "installed_vllm_version",
    "require_supported_vllm",
]

_LAZY = ("StateReadyScheduler", "StateReadyAsyncScheduler")


def __getattr__(name: str) -> Any:
    # vLLM resolves `--scheduler-cls a.b.C` with getattr on the module, which lands here.
    if name in _LAZY:
        require_supported_vllm()
        from radixflow.integrations.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
