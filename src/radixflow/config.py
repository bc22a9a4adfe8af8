"""One tree of configuration dataclasses; the CLI, the server and the Python API read the same one.

Flag names follow vLLM where the concept is the same (`--max-num-seqs`, `--max-num-batched-tokens`,
`--block-size`, `--enable-prefix-caching`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

SNAPSHOT_MODES = ("every-boundary", "chunk-end", "vllm-align")
VLLM_VERSIONS = ("0.33", "0.29")  # vllm-align: the installed vLLM; the paper's (spec/vllm_align.py)
MAMBA_CACHE_MODES = ("align", "all")
CHECKPOINT_MODES = ("boundary", "branch")
HANDOFF_MODES = ("off", "on", "auto")  # SPEC §15
# The engine's dtype names (`--dtype`, `LLM(dtype=...)`) and the dtype each one means
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def _opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class SchedulerConfig:
    max_num_seqs: int = _opt(16, "S: most rows (branches) in one round")
    max_num_batched_tokens: int = _opt(8192, "T: most tokens scheduled in one round")
    block_size: int = _opt(16, "KV page size in tokens; prefix matches are whole pages")
    state_interval: int = _opt(512, "hybrid models: a state snapshot every this many tokens (align mode); "
                                    "non-final prefill chunks end on these boundaries")
    enable_prefix_caching: bool = _opt(True, "reuse cached prefixes across branches")
    snapshot_mode: str = _opt("every-boundary", "hybrid models: 'every-boundary' snapshots every state-interval "
                                                "boundary a chunk crosses, plus a finished branch's end (SPEC §2); "
                                                "'chunk-end' snapshots only where a chunk ends on a boundary and "
                                                "splits a prompt's last chunk there; 'vllm-align' is vLLM 0.33's "
                                                "align mode as vLLM computes it: the block = state interval = "
                                                "vLLM's hybrid block size, its split and junction stops "
                                                "(core/vllm_split.py)")
    internal_checkpoint: bool = _opt(False, "vllm-align: every state layer exports the prompt's last block-"
                                            "boundary state from inside the final chunk (vLLM's "
                                            "mamba_has_prefill_checkpoint_blocks), so that chunk is not cut")
    prefix_match_unit: int = _opt(0, "vllm-align: vLLM's --prefix-match-unit (hash block) in tokens; 0 = the block "
                                     "(vLLM's default: no partial hits). A finer unit that divides the block turns "
                                     "on partial hits and the tail-boundary stop (core/partial_hits.py)")
    vllm_version: str = _opt("0.33", "vllm-align: whose rules: '0.33' (installed) or '0.29' (the paper's: no layer "
                                     "exports a checkpoint inside a chunk, so every hybrid prompt's last chunk is "
                                     "cut; --mamba-cache-mode all exists; docs/simulator.md)")
    mamba_cache_mode: str = _opt("align", "vllm-align: vLLM's --mamba-cache-mode. 'all' (with --vllm-version 0.29): "
                                          "a Mamba-2 model keeps the state at every block boundary, no split, "
                                          "hits on its block; a GDN model falls back to 'align', as vLLM does")
    checkpoints: str = _opt("boundary", "hybrid models: 'boundary' snapshots state only at interval/block "
                                        "boundaries and a finished branch's last page; 'branch' also at the "
                                        "exact depth where a known branch diverges (a sibling, a waiting branch, "
                                        "a cached path) and at the exact end of every prompt and finished "
                                        "branch, inside the same forward (SPEC §14). Full attention: every page "
                                        "is already a checkpoint, so both modes behave alike")
    checkpoint_wait: str = _opt("grid", "--checkpoints branch: when a branch waits a round (Blocked) for a "
                                        "checkpoint its producer writes this round. 'grid': only where "
                                        "boundary mode would wait too (a state boundary lies between the "
                                        "published state and the checkpoint) or when round t+1 runs anyway; "
                                        "N: also whenever the wait saves at least N tokens (64: more reuse, "
                                        "more rounds; docs/checkpoints.md)")
    tail_checkpoints: int = _opt(0, "--checkpoints branch: also snapshot every 4 blocks (block-aligned) in the last "
                                    "this many tokens of every prompt, where the next request sharing the prompt "
                                    "most often diverges (a new question on the same document, an edited last "
                                    "message); 0: none. serve's default: 256 on a hybrid model (docs/server.md)")
    handoff: str = _opt("auto", "hybrid models: in-forward state hand-off (SPEC §15). 'on': a Blocked consumer whose "
                               "boundary lies inside a producer's fragment of the same round runs in that "
                               "forward as a dependent row, reading the producer's state at its depth; "
                               "'auto': hand-off, wait or recompute per consumer by the cost model; "
                               "'off': wait a round, as before. Default auto")
    handoff_max_levels: int = _opt(2, "--handoff: most dependency levels in one forward (level 0 reads only "
                                      "published state)")
    num_kv_pages: int = _opt(1 << 20, "KV pool size in pages")
    num_state_slots: int = _opt(1 << 16, "state snapshot pool size in slots (hybrid models)")
    cache_memory_bytes: int = _opt(0, "if > 0: pages and slots share this many bytes (a unified pool, as "
                                      "vLLM's hybrid allocator); the pool sizes are then upper bounds")
    kv_page_bytes: int = _opt(0, "bytes of one KV page (with cache_memory_bytes)")
    state_slot_bytes: int = _opt(0, "bytes of one state slot (with cache_memory_bytes)")
    eviction: str = _opt("lru", "prefix-cache eviction policy: lru (node-level, a hit refreshes the whole "
                                "path) | rr-tail[:N] (round-robin tail chunks of N pages over idle paths) | "
                                "flop-aware[:W] (prefill FLOPs saved per byte, blended with recency weight W)")

    def validate(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) is smaller than one "
                             f"block ({self.block_size} tokens)")
        if self.state_interval < self.block_size or self.state_interval % self.block_size:
            raise ValueError(f"--state-interval ({self.state_interval}) must be a positive multiple of "
                             f"--block-size ({self.block_size})")
        if self.max_num_batched_tokens < self.state_interval:
            raise ValueError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) is smaller than one "
                             f"state interval ({self.state_interval}); chunked prefill could never advance")
        if self.snapshot_mode not in SNAPSHOT_MODES:
            raise ValueError(f"unknown snapshot mode {self.snapshot_mode!r}; choose from {', '.join(SNAPSHOT_MODES)}")
        if self.prefix_match_unit < 0 or (self.prefix_match_unit and self.snapshot_mode != "vllm-align"):
            raise ValueError(f"--prefix-match-unit {self.prefix_match_unit}: vLLM's hash block, used only with "
                             f"--snapshot-mode vllm-align (0 = the block)")
        if self.vllm_version not in VLLM_VERSIONS:
            raise ValueError(f"unknown --vllm-version {self.vllm_version!r}; choose from {', '.join(VLLM_VERSIONS)}")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"unknown --mamba-cache-mode {self.mamba_cache_mode!r}; choose from "
                             f"{', '.join(MAMBA_CACHE_MODES)}")
        if (self.vllm_version, self.mamba_cache_mode) != ("0.33", "align") and self.snapshot_mode != "vllm-align":
            raise ValueError(f"--vllm-version {self.vllm_version} / --mamba-cache-mode {self.mamba_cache_mode}: "
                             "vLLM's rules, used only with --snapshot-mode vllm-align")
        if self.mamba_cache_mode == "all" and self.vllm_version != "0.29":
            raise ValueError("--mamba-cache-mode all: vLLM 0.33 has no 'all' mode (MambaCacheMode is 'align' | "
                             "'none' in vllm/config/cache.py); use it with --vllm-version 0.29")
        if self.checkpoints not in CHECKPOINT_MODES:
            raise ValueError(f"unknown checkpoint mode {self.checkpoints!r}; choose from {', '.join(CHECKPOINT_MODES)}")
        if self.checkpoint_wait != "grid" and not (self.checkpoint_wait.isdigit() and int(self.checkpoint_wait) > 0):
            raise ValueError(f"--checkpoint-wait must be 'grid' or a positive token count, "
                             f"got {self.checkpoint_wait!r}")
        if self.tail_checkpoints < 0:
            raise ValueError(f"--tail-checkpoints must be >= 0 tokens, got {self.tail_checkpoints}")
        if self.handoff not in HANDOFF_MODES:
            raise ValueError(f"unknown --handoff {self.handoff!r}; choose from {', '.join(HANDOFF_MODES)}")
        if self.handoff_max_levels < 1:
            raise ValueError(f"--handoff-max-levels must be >= 1, got {self.handoff_max_levels}")
        if self.num_kv_pages < 1:
            raise ValueError("the KV pool needs at least one page")


def software_versions() -> dict[str, str | None]:
    """The installed radixflow, torch and vLLM (None: not installed), read from the package metadata
    (nothing is imported), and Python: what a results file's meta records beside the settings."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"radixflow": version("radixflow"), "torch": version("torch"), "vllm": version("vllm"),
            "python": platform.python_version()}


def help_of(cls, name: str) -> str:
    for f in fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(name)
