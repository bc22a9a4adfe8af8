"""Config fields transformers reads: each honoured (logits equal transformers', within fidelity.py's
bound of the float64 truth) or refused at load.

Every model here is a tiny random transformers model saved with `save_pretrained` (conftest), so
the reference is transformers' own forward on the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from fidelity import log_ratio, reference
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.models.activations import ACTIVATIONS

BLOCK = 16
ACTS = sorted(ACTIVATIONS)


def ids(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def ours(path, tokens, cut: int | None = None) -> torch.Tensor:
    """All-position logits of our paged forward; with `cut`, the prompt resumes from a snapshot there."""
    m = load_model(path).model
    cache = m.allocate_cache(16, BLOCK, 2)
    table = list(range(-(-len(tokens) // BLOCK)))
    if cut is None:
        return m([RowInput(tokens, 0, table, None, [], list(range(len(tokens))))], cache)
    first = m([RowInput(tokens[:cut], 0, table, None, [(cut, 1)], list(range(cut)))], cache)
    rest = tokens[cut:]
    second = m([RowInput(rest, cut, table, 1 if m.is_hybrid else None, [], list(range(len(rest))))], cache)
    return torch.cat([first, second])


def assert_same(path, hf, n: int = 70, cut: int | None = 37) -> None:
    tokens = ids(n)
    want = reference(hf, tokens)
    want.check(ours(path, tokens), "whole prompt")
    if cut is not None:
        want.check(ours(path, tokens, cut), f"resumed at {cut}")


def assert_far(hf, got: torch.Tensor, tokens: list[int], what: str) -> None:
    """A guard: `got` fails the check above by over 100x its bound."""
    ratio = reference(hf, tokens).ratio(got)
    log_ratio(what, ratio)
    assert ratio > 100, (what, ratio)


# ------------------------------------------------------------------ honoured: equal to transformers
def test_qwen35_attention_bias(hf_model_factory, hf_configs, tmp_path):
    hf = hf_model_factory({**hf_configs["qwen3_5"], "attention_bias": True}, tmp_path)
    with torch.no_grad():  # biases large enough that dropping them would show
        for name, p in hf.named_parameters():
            if name.endswith("bias") and "self_attn" in name:
                p.normal_(0.0, 0.5)
    hf.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    biases = [k for k in state if k.endswith("_proj.bias")]
    assert {k.split(".")[-2] for k in biases} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert_same(tmp_path, hf)
    no_bias = load_model(tmp_path).model
    with torch.no_grad():
        for k in biases:
            no_bias.get_parameter(k).zero_()
    cache = no_bias.allocate_cache(16, BLOCK, 2)
    tokens = ids(70)
    dropped = no_bias([RowInput(tokens, 0, list(range(5)), None, [], list(range(70)))], cache)
    assert_far(hf, dropped, tokens, "qwen3_5 with its attention biases dropped")


@pytest.mark.parametrize("act", ACTS)
def test_qwen35_hidden_act(act, hf_model_factory, hf_configs, tmp_path):
    """hidden_act drives the MLP and the Gated DeltaNet conv, as in transformers."""
    hf = hf_model_factory({**hf_configs["qwen3_5"], "hidden_act": act}, tmp_path)
    assert_same(tmp_path, hf)


@pytest.mark.parametrize("act", ACTS)
def test_qwen3_hidden_act(act, hf_model_factory, hf_configs, tmp_path):
    hf = hf_model_factory({**hf_configs["qwen3"], "hidden_act": act}, tmp_path)
    assert_same(tmp_path, hf, cut=None)


@pytest.mark.parametrize("i", range(len(ACTS)))
def test_nemotron_mlp_and_mamba_act(i, hf_model_factory, hf_configs, tmp_path):
    """Each field sees every activation once, paired with a different one in the other field."""
    mlp, mamba = ACTS[i], ACTS[(i + 7) % len(ACTS)]
    hf = hf_model_factory({**hf_configs["nemotron_h"], "mlp_hidden_act": mlp, "mamba_hidden_act": mamba}, tmp_path)
    assert_same(tmp_path, hf)


def test_activation_really_changes_the_model(hf_model_factory, hf_configs, tmp_path):
    """Guard for the tests above: a checkpoint with a non-default activation is not loaded as silu."""
    hf = hf_model_factory({**hf_configs["qwen3_5"], "hidden_act": "gelu"}, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "silu"}))
    tokens = ids(40)
    assert_far(hf, ours(tmp_path, tokens), tokens, "qwen3_5 gelu loaded as silu")


def _wrap(directory, text_tie: bool | None) -> None:
    """Rewrite a saved text model as a `qwen3_5` wrapper whose top level carries the tie flag."""
    text = json.loads((directory / "config.json").read_text())
    text.pop("tie_word_embeddings", None)
    if text_tie is not None:
        text["tie_word_embeddings"] = text_tie
    (directory / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
         "tie_word_embeddings": True}))
    state = load_file(str(directory / "model.safetensors"))
    assert "lm_head.weight" not in state  # saved tied
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in state.items()},
              str(directory / "model.safetensors"))


@pytest.mark.parametrize("text_tie", [None, False])
def test_qwen35_wrapper_top_level_tie(text_tie, hf_model_factory, hf_configs, tmp_path):
    """The wrapper's `tie_word_embeddings` governs (Qwen3_5ForConditionalGeneration reads it there),
    whether text_config lacks the key or carries the default false that save_pretrained writes."""
    hf = hf_model_factory({**hf_configs["qwen3_5"], "tie_word_embeddings": True}, tmp_path)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    _wrap(tmp_path, text_tie)
    m = load_model(tmp_path).model
    assert m.config.tie_word_embeddings
    assert_same(tmp_path, hf)


def test_qwen3_tied_head(hf_model_factory, hf_configs, tmp_path):
    hf = hf_model_factory({**hf_configs["qwen3"], "tie_word_embeddings": True}, tmp_path)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    assert_same(tmp_path, hf, cut=None)


def test_qwen35_odd_rotary_width(hf_model_factory, hf_configs, tmp_path):
    """head_dim 20 x 0.25 = 5 rotary channels: transformers rotates 6 (3 frequencies over 5); so do we."""
    base = hf_configs["qwen3_5"]
    spec = {**base, "head_dim": 20, "rope_parameters": {**base["rope_parameters"], "mrope_section": [1, 1, 1]}}
    hf = hf_model_factory(spec, tmp_path)
    assert load_model(tmp_path).model.rotary.rot_dim == 6
    assert_same(tmp_path, hf)


def test_transformers_defaults_for_absent_keys(hf_model_factory, hf_configs, tmp_path):
    """A config without head_dim / hidden_act / rms_norm_eps gets transformers' defaults, not ours."""
    spec = {**hf_configs["qwen3"], "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128}
    hf = hf_model_factory(spec, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k in ("head_dim", "hidden_act", "rms_norm_eps", "attention_bias"):
        del cfg[k]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(tmp_path).model.config.head_dim == 128  # not hidden_size // heads = 32
    assert_same(tmp_path, hf, cut=None)


# ------------------------------------------------------------------ refused at load, naming the field
@pytest.fixture(scope="module")
def saved(tmp_path_factory, hf_model_factory, hf_configs):
    """One saved directory per family to rewrite configs into."""
    out = {}
    for name, spec in hf_configs.items():
        d = tmp_path_factory.mktemp(name)
        hf_model_factory(spec, d)
        out[name] = d
    return out


def with_config(saved, family, tmp_path, **changes):
    import shutil

    d = tmp_path / family
    shutil.copytree(saved[family], d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is _DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


_DELETE = object()

REFUSED = [
    ("qwen3_5", {"hidden_act": "xielu"}, "hidden_act='xielu' keeps its learned parameters in bfloat16"),
    ("qwen3_5", {"hidden_act": "swiglu"}, "hidden_act='swiglu' is not a known activation"),
    ("qwen3", {"hidden_act": "xielu"}, "hidden_act='xielu'"),
    ("qwen3", {"hidden_act": 3}, "hidden_act=3"),
    ("nemotron_h", {"mlp_hidden_act": "geglu"}, "mlp_hidden_act='geglu'"),
    ("nemotron_h", {"mamba_hidden_act": "xielu"}, "mamba_hidden_act='xielu'"),
    ("nemotron_h", {"attention_bias": True}, "attention_bias=true is not supported for nemotron_h"),
    ("nemotron_h", {"mamba_proj_bias": True}, "mamba_proj_bias=true"),
    ("nemotron_h", {"sliding_window": 512}, "sliding_window"),
    ("nemotron_h", {"layers_block_type": ["linear_attention", "moe"]}, r"layer types \['moe'\]"),
    ("qwen3", {"use_sliding_window": True, "max_window_layers": 1, "layer_types": _DELETE}, "use_sliding_window"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "sliding_attention"),
    ("qwen3_5", {"layer_types": ["linear_attention", "full_attention"]}, "layer_types has 2 entries"),
    ("qwen3_5", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ("qwen3_5", {"head_dim": 5, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}},
     "head_dim=5 x partial_rotary_factor=1.0 gives 5 rotary channels, rounded up to 6"),
]


@pytest.mark.parametrize("family,changes,message", REFUSED, ids=[f"{f}-{next(iter(c))}" for f, c, _ in REFUSED])
def test_unsupported_value_refused_at_load(family, changes, message, saved, tmp_path):
    d = with_config(saved, family, tmp_path, **changes)
    with pytest.raises(ValueError, match=message) as e:
        load_model(d)
    assert str(d / "config.json") in str(e.value) and "\n" not in str(e.value)


def test_qwen3_sliding_flag_without_sliding_layers_loads(saved, tmp_path):
    """use_sliding_window leaves every layer full when layer_types lists only full layers (as
    save_pretrained writes them) or max_window_layers >= num_hidden_layers."""
    load_model(with_config(saved, "qwen3", tmp_path / "a", use_sliding_window=True, max_window_layers=1))
    load_model(with_config(saved, "qwen3", tmp_path / "b", use_sliding_window=True, max_window_layers=2,
                           layer_types=_DELETE))


def test_nemotron_tie_flag_needs_a_stored_head(saved, tmp_path):
    """transformers' NemotronH never ties lm_head: tie_word_embeddings=true without one is refused,
    with one the stored head is used (as transformers does)."""
    d = with_config(saved, "nemotron_h", tmp_path, tie_word_embeddings=True)
    before = load_model(saved["nemotron_h"]).model.lm_head.weight
    assert torch.equal(load_model(d).model.lm_head.weight, before)
    state = load_file(str(d / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="never ties its head.*no lm_head.weight"):
        load_model(d)


def test_every_transformers_activation_is_supported_or_refused():
    """A transformers upgrade that adds an activation fails here until it is added or refused."""
    from transformers.activations import ACT2CLS

    assert set(ACT2CLS) - set(ACTIVATIONS) == {"xielu"} and set(ACTIVATIONS) <= set(ACT2CLS)
