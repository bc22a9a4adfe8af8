"""What every model family shares: the batched forward over rows, cache allocation, config parsing.

A family subclass builds `self.model` (embedding, `layers`, final norm, named as in its checkpoints)
and `self.lm_head`, and says which layers hold KV and which hold linear state (`cache_layout`).
Each layer is called as `layer(hidden [N, D], batch, cache) -> hidden` over the packed tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .batch import BatchContext, validate_rows
from .cache import CacheLayout, ModelCache, RowInput
from .chunk_plan import ScanCosts
from .layers import pack_projections
from .level_clock import LevelClock

_REQUIRED = object()


def cfg_get(d: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """config.json value, or a clear error naming the missing key."""
    if key in d and d[key] is not None:
        return d[key]
    if default is _REQUIRED:
        raise ValueError(f"config.json: required key '{key}' is missing (model_type={d.get('model_type')})")
    return default


def eos_ids(d: dict[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def rope_params(d: dict[str, Any]) -> tuple[float, float]:
    """(theta, partial_rotary_factor) from `rope_parameters` (transformers 5) or legacy top-level keys."""
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise ValueError(f"config.json: rope_type '{kind}' is not supported (only 'default')")
    theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0)))
    partial = float(rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)))
    return theta, partial


class CausalLM(nn.Module):
    """Base of the model families: one batched forward per call over a list of RowInput."""

    config: Any
    model: nn.Module
    lm_head: nn.Linear
    ties_embeddings = True  # `tie_word_embeddings` makes lm_head the embedding (False: the family never ties)

    def cache_layout(self) -> CacheLayout:
        raise NotImplementedError

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, batch: BatchContext) -> None:
        """Per-call precomputation shared by layers (e.g. rotary angles); default none."""

    @property
    def is_hybrid(self) -> bool:
        return bool(self.cache_layout().states)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @property
    def eos_token_id(self) -> int | None:
        return self.config.eos_token_ids[0] if self.config.eos_token_ids else None

    def allocate_cache(self, num_pages: int, block_size: int, num_state_slots: int,
                       device: torch.device | str | None = None,
                       dtype: torch.dtype | None = None) -> ModelCache:
        p = next(self.parameters())
        return ModelCache(self.cache_layout(), num_pages, block_size, num_state_slots,
                          device or p.device, dtype or p.dtype)

    def prepare_weights(self) -> int:
        """Once, after the weights are in: fuse same-input projections and reorder every projection's
        weight for oneDNN (layers.pack_projections). Returns how many weights were packed this call (0
        when done before). The Engine calls it while building; a forward calls it if nobody did."""
        if self.__dict__.get("_fused", False):
            return 0
        n = pack_projections(self)
        self.__dict__["_fused"] = True
        return n

    @torch.inference_mode()
    def forward(self, rows: list[RowInput], cache: ModelCache, clock: LevelClock | None = None,
                scan_costs: ScanCosts | None = None) -> torch.Tensor:
        """Run all rows in one batched call; returns fp32 logits [sum(len(r.logits_at)), vocab].

        `clock`, if given, accumulates the time spent in recurrent levels >= 1 (dependent rows);
        `scan_costs`, if given, lets each recurrent level pick its scan chunk by measured cost."""
        validate_rows(rows, cache.block_size, cache.num_pages, cache.num_state_slots, self.is_hybrid)
        if not rows:
            return torch.empty(0, self.vocab_size, device=cache.device)
        self.prepare_weights()
        batch = BatchContext(rows, cache.block_size, cache.device, clock, scan_costs)
        self.prepare(batch)
        h = self.embed(batch.token_ids)
        for layer in self.model.layers:
            h = layer(h, batch, cache)
        h = h[batch.logits_index]
        return self.lm_head(self.final_norm(h)).float()
