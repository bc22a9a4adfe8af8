"""`python -m radixflow.integrations.sglang`: load SGLang's plugins as its server does, then print the
radix-cache backends `--radix-cache-backend` resolves (one per line)."""

from __future__ import annotations

import sys


def main() -> int:
    from radixflow.integrations.sglang.compat import UnsupportedSglangError, require_supported_sglang

    try:
        require_supported_sglang()
    except UnsupportedSglangError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():  # CPU-only machine: SGLang's GPU-only imports (cpu_shim.py)
        from radixflow.integrations.sglang import cpu_shim

        cpu_shim.install()
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, registered_radix_cache_backends
    from sglang.srt.plugins import load_plugins

    load_plugins()
    for name in registered_radix_cache_backends():
        print(f"{name}\t{get_radix_cache_factory(name).__module__}.{get_radix_cache_factory(name).__name__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
