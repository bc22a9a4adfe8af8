"""Importing SGLang 0.5.23 on a CPU-only machine with the CPU build of torch (tests, benchmarks).

Two of the modules SGLang imports on the way to its radix cache only exist for a GPU build:

- `torchvision`: `sglang.srt.configs` imports every model config, and the vision ones import
  `torchvision.transforms` at module level. The only torchvision wheel for torch 2.13 on the
  registry links `libtorch_cuda`, so it cannot load next to the CPU torch.
- `sgl_kernel`: with `SGLANG_USE_CPU_ENGINE=1` (how SGLang selects its CPU platform, which the cache
  fixtures need for `get_device()`), `memory_pool`, `allocation` and the KV-move kernels import CPU ops
  from `sgl_kernel`, which ships as a CUDA wheel (`sglang-kernel`).

`install()` puts a stand-in module for each in `sys.modules`, only when the real one cannot be
imported: names resolve at import time, and calling anything in them raises `RuntimeError` naming
this shim. The radix cache, its pools and allocators never call them (they move indices, not KV). It
first asks transformers whether torchvision is available (and caches the answer, False), so
transformers does not take the stand-in for a real torchvision. SGLang's own files are not touched.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

_TORCHVISION = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                "torchvision.transforms.v2", "torchvision.transforms.v2.functional", "torchvision.io")
installed: list[str] = []


class _Unavailable:
    """Any name in a stand-in module: attribute access works, calling raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a stand-in from radixflow.integrations.sglang.cpu_shim "
                           "(no GPU build of its package here); only SGLang's cache code may run")


def _stand_in(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []

    def __getattr__(attr: str, _name=name):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{_name}.{attr}")

    mod.__getattr__ = __getattr__
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    installed.append(name)
    return mod


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except Exception:  # missing, or a CUDA build failing to load against the CPU torch
        sys.modules.pop(name, None)
        return False


def install() -> list[str]:
    """Selects SGLang's CPU platform and stands in for the GPU-only modules; returns their names."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    if "torchvision" not in sys.modules and not _importable("torchvision"):
        try:
            from transformers.utils import import_utils
            import_utils.is_torchvision_available()  # cached False before the stand-in exists
        except ImportError:
            pass
        for name in _TORCHVISION:
            _stand_in(name)
    if "sgl_kernel" not in sys.modules and not _importable("sgl_kernel"):
        _stand_in("sgl_kernel")
    return list(installed)
