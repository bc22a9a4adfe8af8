"""What the tiny and the real-size random models share: the model cache directory, the byte
tokenizer's eos/pad ids, and how one weight tensor is drawn from a seeded generator."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

EOS_ID, PAD_ID = 258, 256  # <|im_end|>, <|endoftext|> in the byte-level tokenizer


def default_cache_dir() -> Path:
    return Path(os.environ.get("RADIXFLOW_CACHE", "~/.cache/radixflow")).expanduser() / "models"


def init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, zero_centered: bool) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    leaf = name.rsplit(".", 2)[-2] if "." in name else name
    if name.endswith("A_log"):
        return torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen))
    if name.endswith("dt_bias"):
        return -2.0 + 2.0 * torch.rand(shape, generator=gen)   # softplus -> dt in ~[0.13, 0.69]
    if name.endswith(".D"):
        return 1.0 + 0.1 * noise
    if "norm" in leaf:
        plain = not zero_centered or name.endswith("linear_attn.norm.weight")
        return (1.0 if plain else 0.0) + 0.1 * noise
    if name.endswith("bias"):
        return 0.02 * noise
    if "conv1d" in name:
        return noise / math.sqrt(shape[-1])
    if "embed" in name:
        return noise
    return noise / math.sqrt(shape[-1])   # fan-in scaling keeps activations O(1)


def build_once(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """`target`, written by `write(tmp)` into a temporary sibling and renamed into place the first time
    (atomically: a concurrent builder's rename wins, ours is dropped); `marker` is the file whose
    presence means the directory is complete."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        os.rename(tmp, target)
    except OSError:
        if not (target / marker).is_file():  # not a lost race with another writer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
