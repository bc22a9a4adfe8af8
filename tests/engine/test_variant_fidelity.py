"""Qwen3.5 config variants at most 3x transformers' own fp32 error from the float64 truth (issue 45).

A hidden check found one variant (MHA with 2 heads of 32, conv kernel 2, partial_rotary_factor 0.125,
6 value heads per 2 key heads) at 5.3x transformers' own error; this keeps that variant and its
neighbours (odd conv kernels, small partial rotary, other value/key head ratios) within 3x on the paths
a server runs: the whole prompt in one forward, the prompt resumed from a state snapshot, and decode
steps whose rows step their state in its slot (`BatchContext.states_in_place`); prompts at the CPU
chunk the engine runs without measured costs, at the model's own and at the smallest a calibration
picks. The weights are drawn as the tiny models' (`tiny.random_weights`: decays and scales that make
the recurrent state matter), not conftest's near-default ones, whose fp32 error is mostly the floor.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from fidelity import reference, set_threads
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.models.chunk_plan import ScanCosts
from radixflow.engine.tiny import TINY_CONFIGS, random_weights
from radixflow.engine.tokenizer import save_byte_tokenizer

BLOCK = 16
FACTOR = 3.0   # the bound: 3x the reference's own fp32 error (fidelity.py's floor kept)
N, CUT, DECODE = 90, 37, 8


def _rope(factor: float) -> dict:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": factor,
                                "mrope_section": [2, 1, 1], "mrope_interleaved": True}}


# the hidden check's variant, then one change of it at a time, then the neighbours on the tiny model
FOUND = {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "linear_conv_kernel_dim": 2,
         **_rope(0.125), "linear_num_key_heads": 2, "linear_num_value_heads": 6}
VARIANTS = {
    "mha2x32-conv2-rot0.125-v6k2": FOUND,
    "found-conv3": {**FOUND, "linear_conv_kernel_dim": 3},
    "found-conv5": {**FOUND, "linear_conv_kernel_dim": 5},
    "found-rot0.0625": {**FOUND, **_rope(0.0625)},
    "found-v3k1": {**FOUND, "linear_num_key_heads": 1, "linear_num_value_heads": 3},
    "found-seed1": {**FOUND, "_seed": 1},
    "conv2": {"linear_conv_kernel_dim": 2},
    "rot0.125": _rope(0.125),
    "v6k2": {"linear_num_value_heads": 6},
    "v8k2-conv3": {"linear_num_value_heads": 8, "linear_conv_kernel_dim": 3},
}


def ids(n: int, seed: int = 4) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def variant(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    set_threads()
    changes = dict(VARIANTS[request.param])
    seed = changes.pop("_seed", 0)
    d = tmp_path_factory.mktemp(request.param)
    cfg = {**TINY_CONFIGS["tiny-qwen3.5"], **changes}
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(random_weights(cfg, seed), str(d / "model.safetensors"), metadata={"format": "pt"})
    save_byte_tokenizer(d)
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tokens = ids(N)
    ref = dataclasses.replace(reference(hf, tokens), factor=FACTOR)
    return request.param, load_model(d).model, tokens, ref


@pytest.mark.parametrize("chunk", [None, 64, 8], ids=["cpu-chunk", "model-chunk", "chunk-8"])
def test_whole_prompt_and_resumed_within_3x(variant, chunk):
    name, model, tokens, ref = variant
    costs = None if chunk is None else ScanCosts({}, {}, fixed=chunk)
    cache = model.allocate_cache(16, BLOCK, 2)
    table = list(range(-(-N // BLOCK)))
    whole = model([RowInput(tokens, 0, table, None, [], list(range(N)))], cache, None, costs)
    ref.check(whole, f"{name} whole prompt")
    first = model([RowInput(tokens[:CUT], 0, table, None, [(CUT, 1)], list(range(CUT)))], cache, None, costs)
    rest = model([RowInput(tokens[CUT:], CUT, table, 1, [], list(range(N - CUT)))], cache, None, costs)
    ref.check(torch.cat([first, rest]), f"{name} resumed at {CUT}")


def test_decode_steps_in_their_slots_within_3x(variant):
    """The prompt's last tokens one at a time, two rows at once each stepping its own slot (a server's
    decode round), beside the prefill's logits."""
    name, model, tokens, ref = variant
    cache = model.allocate_cache(32, BLOCK, 4)
    n0 = N - DECODE
    pages = -(-N // BLOCK)
    tables = [list(range(pages)), list(range(pages, 2 * pages))]
    pre = [model([RowInput(tokens[:n0], 0, t, None, [(n0, 1 + r)], list(range(n0)))], cache) for r, t in
           enumerate(tables)]
    steps = []
    for p in range(n0, N):
        rows = [RowInput([tokens[p]], p, t, 1 + r, [(1, 1 + r)], [0]) for r, t in enumerate(tables)]
        steps.append(model(rows, cache))
    got = torch.stack(steps)                                          # [DECODE, 2 rows, V]
    for r in range(2):
        ref[:n0].check(pre[r], f"{name} prefill of row {r}")
        ref[n0:].check(got[:, r], f"{name} decoded row {r}")   # the whole prompt's bound, these positions
