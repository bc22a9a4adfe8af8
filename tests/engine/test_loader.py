"""Loader: checkpoint layout variants load identically; broken directories give clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.tiny import ensure_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return ensure_tiny_model("tiny-qwen3.5", cache_dir=tmp_path_factory.mktemp("tiny"))


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def logits(path):
    m = load_model(path).model
    ids = list(range(40, 120))
    return m([RowInput(ids, 0, list(range(5)), None, [], [79])], m.allocate_cache(8, 16, 1))


def test_sharded_checkpoint(tiny, tmp_path):
    d = copy(tiny, tmp_path / "sharded")
    state = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(state)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for f, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(d / f))
    index = {"weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.allclose(logits(d), logits(tiny), atol=1e-5)


def test_multimodal_wrapper_config_and_prefix(tiny, tmp_path):
    d = copy(tiny, tmp_path / "wrapped")
    text = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    state = load_file(str(d / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    renamed["model.visual.patch_embed.weight"] = torch.zeros(2)   # vision tower: skipped
    renamed["mtp.fc.weight"] = torch.zeros(2)                     # multi-token prediction: skipped
    save_file(renamed, str(d / "model.safetensors"))
    assert torch.allclose(logits(d), logits(tiny), atol=1e-5)


def test_nemotron_backbone_prefix(tmp_path):
    src = ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path / "cache")
    d = copy(src, tmp_path / "backbone")
    state = load_file(str(d / "model.safetensors"))
    renamed = {k.replace("model.", "backbone.", 1): v for k, v in state.items()}
    save_file(renamed, str(d / "model.safetensors"))
    assert torch.allclose(logits(d), logits(src), atol=1e-5)


def test_bf16_load(tiny):
    m = load_model(tiny, dtype=torch.bfloat16).model
    assert next(m.parameters()).dtype == torch.bfloat16
    out = m([RowInput(list(range(40, 120)), 0, list(range(5)), None, [], [79])], m.allocate_cache(8, 16, 1))
    assert out.dtype == torch.float32
    assert (out - logits(tiny)).abs().max() < 0.5


def test_missing_directory_and_files(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "absent")
    d = copy(tiny, tmp_path / "noconfig")
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(d)
    d = copy(tiny, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(d)
    d = copy(tiny, tmp_path / "notok")
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_model(d)


def test_unsupported_model_type(tiny, tmp_path):
    d = copy(tiny, tmp_path / "llama")
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        load_model(d)


def test_missing_config_key(tiny, tmp_path):
    d = copy(tiny, tmp_path / "nokey")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_size"):
        load_model(d)


def test_missing_and_misshaped_tensors(tiny, tmp_path):
    state = load_file(str(tiny / "model.safetensors"))
    d = copy(tiny, tmp_path / "missing")
    save_file({k: v for k, v in state.items() if k != "model.norm.weight"}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="missing.*model.norm.weight"):
        load_model(d)
    d = copy(tiny, tmp_path / "shape")
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(3)
    save_file(bad, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="wrong shape.*model.norm.weight"):
        load_model(d)


def test_bf16_hybrid_resume(tmp_path):
    """bf16 weights/KV/conv with fp32 recurrent state: a resumed prompt stays close to fp32."""
    path = ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path)
    ids = list(range(30, 230))
    outs = []
    for dtype in (torch.float32, torch.bfloat16):
        m = load_model(path, dtype=dtype).model
        cache = m.allocate_cache(16, 16, 2)
        m([RowInput(ids[:100], 0, list(range(13)), None, [(100, 1)], [])], cache)
        outs.append(m([RowInput(ids[100:], 100, list(range(13)), 1, [], [99])], cache))
    assert outs[1].dtype == torch.float32
    assert (outs[0] - outs[1]).abs().max() < 0.5
