"""The three cases of issue 27 at real widths, on our model and transformers' over the same weights.

The models are the `random:` ones (`radixflow.engine.random_models`, the one builder of random-weight
real-shape models): `real_config(name, layers)` is `random_config`, the real widths cut to `layers` layers
(per-layer cost is what a round pays; fewer layers keep a 2-core run short). `build_pair` puts ONE copy
of `random_weights` into our model and a transformers model, in memory (no file). `make_cases` gives
(a) one long prefill, (b) a round of 16 rows where half resume from a cached prefix, (c) one decode step
of 16 rows at ~2k context.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from radixflow.engine.models import CausalLM, ModelCache, RowInput, build_model
from radixflow.engine.random_models import RANDOM_MODELS, random_config, random_weights

BLOCK = 16
INTERVAL = 512      # the CLI's default --state-interval: a row captures its state at every multiple
REAL_MODELS = tuple(n.removeprefix("random:") for n in RANDOM_MODELS)
real_config = random_config


def build_pair(cfg: dict[str, Any], seed: int = 0) -> tuple[CausalLM, torch.nn.Module]:
    """(ours, transformers') over the same parameter tensors, fp32, eval mode, sdpa attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    state = random_weights(cfg, seed)
    if "lm_head.weight" not in state:   # tied: both heads are the embedding
        state["lm_head.weight"] = next(v for k, v in state.items() if k.startswith("model.embed"))
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
