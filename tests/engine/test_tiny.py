"""Tiny models: deterministic, written once, loadable by transformers with equal logits."""

from __future__ import annotations

import pytest
import torch

from fidelity import reference
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.tiny import TINY_MODELS, ensure_tiny_model, resolve_model


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes(tmp_path):
    a = ensure_tiny_model("tiny-qwen3", cache_dir=tmp_path / "a")
    b = ensure_tiny_model("tiny-qwen3", cache_dir=tmp_path / "b")
    assert _files(a) == _files(b)
    c = ensure_tiny_model("tiny-qwen3", cache_dir=tmp_path / "a", seed=1)
    assert c != a and _files(c)["model.safetensors"] != _files(a)["model.safetensors"]


def test_written_once_without_leftovers(tmp_path):
    d = ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path)
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-nemotron-h"]  # no temp dirs left


def test_env_var_sets_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    assert ensure_tiny_model("tiny-qwen3") == tmp_path / "models" / "tiny-qwen3"


@pytest.mark.parametrize("name", TINY_MODELS)
def test_transformers_loads_the_same_model(name, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d = ensure_tiny_model(name, cache_dir=tmp_path_factory.getbasetemp() / "tiny")
    ours = load_model(d).model
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.randint(0, 259, (90,), generator=torch.Generator().manual_seed(0)).tolist()
    out = ours([RowInput(ids, 0, list(range(6)), None, [], list(range(90)))], ours.allocate_cache(8, 16, 1))
    # Within fidelity.py's bound of the float64 truth: the tiny models have O(1) logits and
    # fan-in-scaled weights, so transformers' own fp32 error here is up to ~1e-3 on some CPUs.
    reference(hf, ids).check(out, name)


def test_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    assert resolve_model("tiny-qwen3") == tmp_path / "models" / "tiny-qwen3"
    assert resolve_model(tmp_path) == tmp_path
    with pytest.raises(ValueError, match="tiny-qwen3.5"):
        resolve_model(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown tiny model"):
        ensure_tiny_model("tiny-llama")
