"""Stand-in modules for GPU-only packages that an integration's imports name but never call on a CPU.

`stand_in(name)` puts an empty module in `sys.modules` (and on its parent): every name in it resolves,
calling one raises `RuntimeError` naming the module that installed it. `stand_in_for_torchvision(by)`
does that for the torchvision modules the SGLang and vLLM model files import at module level, only when
no torchvision imports (the only torchvision wheel for torch 2.13 on PyPI links `libtorch_cuda` and
cannot load next to the CPU torch); first it asks transformers whether torchvision is available (the
answer, False, is cached), so transformers never takes the stand-in for a real torchvision.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

TORCHVISION_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                       "torchvision.transforms.v2", "torchvision.transforms.v2.functional", "torchvision.io")
installed: list[str] = []


class _Unavailable:
    """Any name in a stand-in module: attribute access works, calling raises."""

    def __init__(self, name: str, by: str) -> None:
        self._name = name
        self._by = by

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}", self._by)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a stand-in from {self._by} (no GPU build of its package here); "
                           "only code that never calls it may run")


def stand_in(name: str, by: str) -> types.ModuleType:
    """Put a stand-in module `name` into `sys.modules`; `by` names the caller in its error messages."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []

    def __getattr__(attr: str, _name=name):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{_name}.{attr}", by)

    mod.__getattr__ = __getattr__
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    installed.append(name)
    return mod


def importable(name: str) -> bool:
    """Whether `name` imports here (a CUDA build failing to load against the CPU torch does not)."""
    try:
        __import__(name)
        return True
    except Exception:
        sys.modules.pop(name, None)
        return False


def stand_in_for_torchvision(by: str) -> bool:
    """Stand in for torchvision when no torchvision imports; returns whether the stand-in is in place."""
    if "torchvision" in sys.modules:
        return "torchvision" in installed
    if importable("torchvision"):
        return False
    try:
        from transformers.utils import import_utils
        import_utils.is_torchvision_available()  # cached False before the stand-in exists
    except ImportError:
        pass
    for name in TORCHVISION_MODULES:
        stand_in(name, by)
    return True
