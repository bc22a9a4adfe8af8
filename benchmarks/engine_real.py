"""Real-size shapes for the engine benchmarks: random-weight models at the real configs, built in memory.

`real_config(name, layers)` gives an HF config dict at the real widths of `qwen3.5-0.8b`, `qwen3-0.6b`
or `nemotron-h-1b` (the Nemotron-Nano-9B-v2 layer pattern at ~1B widths), cut to `layers` layers
(per-layer cost is what a round pays; fewer layers keep a 2-core run short). `build_pair` returns our
model and a transformers model holding the SAME parameter tensors (one copy in memory), and
`cases` the three shapes of issue 27: (a) one long prefill, (b) a round of 16 rows where half resume
from a cached prefix, (c) one decode step of 16 rows at ~2k context.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from radixflow.engine.models import CausalLM, ModelCache, RowInput, build_model
from radixflow.engine.tiny import random_weights

BLOCK = 16
INTERVAL = 512      # the CLI's default --state-interval: a row captures its state at every multiple
NEMOTRON_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"   # Nemotron-Nano-9B-v2
_NEMO_KIND = {"M": "mamba", "-": "mlp", "*": "attention"}

_REAL: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3.5-0.8B text config (the model_spec preset), untied here so both models own a head
    "qwen3.5-0.8b": {
        "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 248320,
        "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "tie_word_embeddings": False, "eos_token_id": 258, "dtype": "float32"},
    # Qwen/Qwen3-0.6B
    "qwen3-0.6b": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": False, "eos_token_id": 258, "dtype": "float32"},
    # Nemotron-Nano-9B-v2's pattern and head shapes at ~1B widths (hidden 1536, 48 Mamba heads x 64)
    "nemotron-h-1b": {
        "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 131072,
        "hidden_size": 1536, "intermediate_size": 5376, "num_attention_heads": 12, "num_key_value_heads": 4,
        "head_dim": 128, "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2", "ssm_state_size": 128,
        "mamba_num_heads": 48, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
        "use_conv_bias": True, "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "eos_token_id": 258, "dtype": "float32"},
}
REAL_MODELS = tuple(_REAL)


def real_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """HF config of `name` with `layers` layers: Qwen3.5 keeps its 3:1 linear:full order from layer 0;
    Nemotron-H takes `layers` consecutive blocks of its pattern starting at block 6 ("MM-M-M-M*-..."),
    so a 9-layer cut holds Mamba, MLP and attention blocks in about the full model's proportion."""
    if name not in _REAL:
        raise ValueError(f"unknown real-size model {name!r}; choose one of {', '.join(REAL_MODELS)}")
    cfg = copy.deepcopy(_REAL[name])
    if cfg["model_type"] == "nemotron_h":
        pattern = NEMOTRON_PATTERN if layers is None else (NEMOTRON_PATTERN[6:] + NEMOTRON_PATTERN)[:layers]
        cfg["layers_block_type"] = [{"M": "linear_attention", "-": "mlp", "*": "full_attention"}[c]
                                    for c in pattern]
        return cfg
    n = cfg["num_hidden_layers"] if layers is None else layers
    cfg["num_hidden_layers"] = n
    if cfg["model_type"] == "qwen3_5_text":
        cfg["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    return cfg


def build_pair(cfg: dict[str, Any], seed: int = 0) -> tuple[CausalLM, torch.nn.Module]:
    """(ours, transformers') over the same parameter tensors, fp32, eval mode, sdpa attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    state = random_weights(cfg, seed)
    with torch.device("meta"):
        ours = build_model(cfg)
    ours.load_state_dict(state, strict=True, assign=True)
    ours.eval()
    spec = {k: v for k, v in cfg.items() if k != "model_type"}
    hf_cfg = AutoConfig.for_model(cfg["model_type"], **spec)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32, attn_implementation="sdpa")
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise RuntimeError(f"transformers model does not take our weights: missing {missing}, "
                           f"unexpected {unexpected}")
    _rebuild_meta_buffers(hf)
    hf.eval()
    return ours, hf


def _rebuild_meta_buffers(hf: torch.nn.Module) -> None:
    """Non-persistent buffers (rotary inv_freq) were created on meta: rebuild those modules on the CPU."""
    for name, mod in list(hf.named_modules()):
        if any(b.is_meta for b in mod.buffers(recurse=False)) and hasattr(mod, "config"):
            parent, _, attr = name.rpartition(".")
            setattr(hf.get_submodule(parent) if parent else hf, attr, type(mod)(mod.config))
    for name, buf in hf.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"transformers buffer {name} is still on the meta device")


class Pages:
    """A bump allocator of KV pages and state slots for hand-built rows."""

    def __init__(self) -> None:
        self.page = 0
        self.slot = 0

    def pages(self, n_tokens: int) -> list[int]:
        n = -(-n_tokens // BLOCK)
        self.page += n
        return list(range(self.page - n, self.page))

    def slots(self, n: int) -> list[int]:
        self.slot += n
        return list(range(self.slot - n, self.slot))


def captures(start: int, n: int, pages: Pages) -> list[tuple[int, int]]:
    """state_out of a row covering [start, start + n): every INTERVAL multiple it crosses and its end."""
    points = sorted({k - start for k in range(start + 1, start + n + 1) if k % INTERVAL == 0} | {n})
    return list(zip(points, pages.slots(len(points))))


@dataclass
class Case:
    """One timed shape: our rows over a prepared cache, and transformers' calls over the same tokens."""

    label: str
    tokens: int                  # tokens scheduled in the call
    rows: list[RowInput]
    cache: ModelCache
    hf_calls: list[tuple[torch.Tensor, Any]]     # (input ids [B, L], prefix cache or None)

    def run_ours(self, model: CausalLM) -> torch.Tensor:
        return model(self.rows, self.cache)

    def hf_inputs(self) -> list[tuple[torch.Tensor, Any]]:
        """Fresh copies of the prefix caches (transformers extends them in place): untimed setup."""
        return [(ids, copy.deepcopy(c) if c is not None else None) for ids, c in self.hf_calls]


def run_hf(hf: torch.nn.Module, calls: list[tuple[torch.Tensor, Any]]) -> torch.Tensor:
    """transformers' forwards one after another (it has no ragged batch); last-position logits of each."""
    out = []
    with torch.inference_mode():
        for ids, past in calls:
            if past is None:
                out.append(hf(ids, use_cache=False, logits_to_keep=1).logits[:, -1])
            else:
                out.append(hf(ids, past_key_values=past, use_cache=True, logits_to_keep=1).logits[:, -1])
    return torch.cat(out)


def _hf_prefix(hf: torch.nn.Module, ids: list[int]) -> Any:
    with torch.inference_mode():
        return hf(torch.tensor([ids]), use_cache=True, logits_to_keep=1).past_key_values


def _repeat_rows(past: Any, n: int) -> None:
    """transformers' cache of one sequence made a batch of n copies (attention and linear layers)."""
    for layer in past.layers:
        for store in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
            for k, t in (store or {}).items():
                if t is not None:
                    store[k] = t.repeat_interleave(n, dim=0)
        if isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.numel():
            layer.keys = layer.keys.repeat_interleave(n, dim=0)
            layer.values = layer.values.repeat_interleave(n, dim=0)


def _prefill_into(model: CausalLM, cache: ModelCache, ids: list[int], pages: list[int], slot: int) -> None:
    model([RowInput(ids, 0, pages, None, [(len(ids), slot)], [])], cache)


def make_cases(ours: CausalLM, hf: torch.nn.Module, vocab: int, which: str = "abc", seq_len: int = 2048,
               rows: int = 16, round_tokens: int = 8192, prefix: int = 1024, context: int = 2048,
               seed: int = 0) -> list[Case]:
    gen = torch.Generator().manual_seed(seed)

    def toks(n: int) -> list[int]:
        return torch.randint(0, min(vocab, 256), (n,), generator=gen).tolist()

    out: list[Case] = []
    if "a" in which:
        p = Pages()
        seq = toks(seq_len)
        row = RowInput(seq, 0, p.pages(seq_len), None, captures(0, seq_len, p), [seq_len - 1])
        cache = ours.allocate_cache(p.page, BLOCK, max(p.slot, 1))
        out.append(Case(f"(a) 1 x {seq_len}", seq_len, [row], cache, [(torch.tensor([seq]), None)]))
    if "b" in which:
        # half the rows fresh, half resuming after one shared cached prefix (a hit on its pages and state)
        p = Pages()
        pre = toks(prefix)
        pre_pages = p.pages(prefix)
        (pre_slot,) = p.slots(1)
        half = rows // 2
        mean = round_tokens // rows
        lengths = torch.randint(mean // 2, mean * 3 // 2 + 1, (rows,), generator=gen).tolist()
        lengths[-1] += round_tokens - sum(lengths)
        rr, calls = [], []
        pre_hf = _hf_prefix(hf, pre)
        for i, n in enumerate(lengths):
            ids = toks(n)
            if i < half:
                rr.append(RowInput(ids, 0, p.pages(n), None, captures(0, n, p), [n - 1]))
                calls.append((torch.tensor([ids]), None))
            else:
                # its own pages after the shared prefix pages (prefix is a whole number of pages)
                table = pre_pages + p.pages(prefix + n)[prefix // BLOCK:]
                rr.append(RowInput(ids, prefix, table, pre_slot, captures(prefix, n, p), [n - 1]))
                calls.append((torch.tensor([ids]), pre_hf))
        cache = ours.allocate_cache(p.page, BLOCK, p.slot)
        _prefill_into(ours, cache, pre, pre_pages, pre_slot)
        out.append(Case(f"(b) {rows} rows, {half} resumed", sum(lengths), rr, cache, calls))
    if "c" in which:
        # one decode step of `rows` rows at `context`: each row its own copy of one prefilled context
        p = Pages()
        ctx = toks(context)
        first = p.pages(context + 1)
        tables = [first] + [p.pages(context + 1) for _ in range(rows - 1)]
        slots = p.slots(rows)
        outs = p.slots(rows)
        cache = ours.allocate_cache(p.page, BLOCK, p.slot)
        _prefill_into(ours, cache, ctx, first, slots[0])
        for t, s in zip(tables[1:], slots[1:]):
            for a, b in zip(first, t):
                cache.copy_page(a, b)
            if cache.num_state_slots:
                cache.copy_state(slots[0], s)
        nxt = toks(rows)
        rr = [RowInput([nxt[i]], context, tables[i], slots[i] if cache.num_state_slots else None,
                       [(1, outs[i])] if cache.num_state_slots else [], [0]) for i in range(rows)]
        past = _hf_prefix(hf, ctx)
        _repeat_rows(past, rows)
        out.append(Case(f"(c) decode {rows} x {context}", rows, rr, cache,
                        [(torch.tensor(nxt)[:, None], past)]))
    return out
