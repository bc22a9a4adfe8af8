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

import os
import sys

from radixflow.integrations.stand_ins import importable, installed, stand_in, stand_in_for_torchvision


def install() -> list[str]:
    """Selects SGLang's CPU platform and stands in for the GPU-only modules; returns their names."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    stand_in_for_torchvision(__name__)
    if "sgl_kernel" not in sys.modules and not importable("sgl_kernel"):
        stand_in("sgl_kernel", __name__)
    return list(installed)
