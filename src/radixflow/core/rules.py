"""The geometry and snapshot rules of one scheduler: page and interval sizes, the snapshot mode's
switches, and the fragment rule (how many tokens one row gets) that every part of the core shares."""

from __future__ import annotations

from radixflow.cache.radix import Match
from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.core.checkpoints import BranchPoints
from radixflow.core.vllm_split import aligned_split


class Rules:
    """Read-only after construction; the scheduler's managers share one."""

    def __init__(self, config: SchedulerConfig, hybrid: bool) -> None:
        self.config = config
        self.hybrid = hybrid
        self.block_size = config.block_size
        self.interval = config.state_interval if hybrid else config.block_size
        self.vllm_align = hybrid and config.snapshot_mode == "vllm-align"
        if self.vllm_align and config.state_interval != config.block_size:
            raise ValueError(f"--snapshot-mode vllm-align keeps state on KV blocks: the state interval "
                             f"({config.state_interval}) must equal the block size ({config.block_size}); "
                             f"spec.vllm_align.apply_vllm_align sets both to vLLM's block")
        # vLLM's hash block; below the block, partial hits and the tail-boundary stop (core/partial_hits.py)
        self.unit = (config.prefix_match_unit or config.block_size) if self.vllm_align else config.block_size
        self.partial_hits = self.vllm_align and self.unit < config.block_size
        if self.vllm_align and config.block_size % self.unit:
            raise ValueError(f"--prefix-match-unit {self.unit} must divide the {config.block_size}-token block")
        # vLLM 0.29's --mamba-cache-mode all (Mamba-2 only): no split, a state at every block boundary
        # crossed, hits on the block; the every-boundary path does it, never cutting a chunk (chunk)
        self.vllm_all = self.vllm_align and config.mamba_cache_mode == "all"
        self.chunk_end = hybrid and config.snapshot_mode in ("chunk-end", "vllm-align") and not self.vllm_all
        self.branch_points = (BranchPoints(config.block_size, self.interval, min(64, config.state_interval // 2),
                                           None if config.checkpoint_wait == "grid" else int(config.checkpoint_wait))
                              if hybrid and config.checkpoints == "branch" else None)

    def junction(self, m: Match, start: int) -> int:
        """vllm-align: the KV hit's depth when it runs past the state hit (vLLM stops a chunk there)."""
        return m.depth if self.vllm_align and m.depth > start else 0

    def chunk(self, start: int, total: int, tokens: int, b: Branch | None = None, junction: int = 0) -> int:
        """Tokens for one row: all that is left if it fits, else a chunk cut to a state boundary.
        In chunk-end mode a last chunk that crosses a boundary is cut there too, so that boundary's
        state is cached (vLLM's align mode); the tail runs in a later round. vllm-align applies
        vLLM's own split (core/vllm_split.py)."""
        n = min(total - start, tokens)
        if self.vllm_all:  # need_mamba_block_aligned_split is align-only: vLLM takes what the budget gives
            return max(n, 0)
        if self.vllm_align and b is not None:
            return aligned_split(start, max(n, 0), b.prompt_len, total, self.interval,
                                 self.config.max_num_batched_tokens, self.config.internal_checkpoint, junction,
                                 self.unit)
        if self.hybrid:
            aligned = (start + n) // self.interval * self.interval
            if n < total - start or (self.chunk_end and start < aligned < start + n):
                n = aligned - start
        return max(n, 0)
