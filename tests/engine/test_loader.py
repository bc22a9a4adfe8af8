"""Loader: checkpoint layout variants load identically; broken directories give clear errors."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from fidelity import low_precision_attention, reference
from radixflow.engine.loader import ModelLoadError, check_model, load_model
from radixflow.engine.models import RowInput
from radixflow.engine.tiny import ensure_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return ensure_tiny_model("tiny-qwen3.5", cache_dir=tmp_path_factory.mktemp("tiny"))


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


IDS = list(range(40, 120))


def logits(path, dtype=torch.float32):
    m = load_model(path, dtype=dtype).model
    with low_precision_attention() if dtype != torch.float32 else contextlib.nullcontext():
        return m([RowInput(IDS, 0, list(range(5)), None, [], [79])], m.allocate_cache(8, 16, 1))


def truth(path, dtype=torch.float32):
    """The last position's float64 truth of transformers' load of `path` (fidelity.py)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return reference(hf, IDS, dtype)[-1:]


def assert_loads_the_same(d, src) -> None:
    """`d` (a layout variant of `src`) gives `src`'s logits: both within the bound of its truth."""
    ref = truth(src)
    ref.check(logits(src), src.name)
    ref.check(logits(d), d.name)


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
    assert_loads_the_same(d, tiny)


def test_multimodal_wrapper_config_and_prefix(tiny, tmp_path):
    d = copy(tiny, tmp_path / "wrapped")
    text = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    state = load_file(str(d / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    renamed["model.visual.patch_embed.weight"] = torch.zeros(2)   # vision tower: skipped
    renamed["mtp.fc.weight"] = torch.zeros(2)                     # multi-token prediction: skipped
    save_file(renamed, str(d / "model.safetensors"))
    assert_loads_the_same(d, tiny)


def test_nemotron_backbone_prefix(tmp_path):
    src = ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path / "cache")
    d = copy(src, tmp_path / "backbone")
    state = load_file(str(d / "model.safetensors"))
    renamed = {k.replace("model.", "backbone.", 1): v for k, v in state.items()}
    save_file(renamed, str(d / "model.safetensors"))
    assert_loads_the_same(d, src)


def test_bf16_load(tiny):
    m = load_model(tiny, dtype=torch.bfloat16).model
    assert next(m.parameters()).dtype == torch.bfloat16
    out = logits(tiny, torch.bfloat16)
    assert out.dtype == torch.float32
    truth(tiny, torch.bfloat16).check(out, "bf16")  # the bound of transformers' own bf16 error


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
    """bf16 weights/KV/conv with fp32 recurrent state: a resumed prompt stays as close to the float64
    truth as transformers' own bf16 (fp32: its own fp32) forward allows (fidelity.py's bound)."""
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model("tiny-nemotron-h", cache_dir=tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = list(range(30, 230))
    for dtype in (torch.float32, torch.bfloat16):
        m = load_model(path, dtype=dtype).model
        cache = m.allocate_cache(16, 16, 2)
        with low_precision_attention():
            m([RowInput(ids[:100], 0, list(range(13)), None, [(100, 1)], [])], cache)
            out = m([RowInput(ids[100:], 100, list(range(13)), 1, [], [99])], cache)
        assert out.dtype == torch.float32
        reference(hf, ids, dtype)[-1:].check(out, f"resumed at 100 in {dtype}")


# ------------------------------------------------------------------ strict loading
def test_leftover_tensor_fails_naming_it(tiny, tmp_path):
    d = copy(tiny, tmp_path / "extra")
    state = load_file(str(d / "model.safetensors"))
    state["model.layers.0.mlp.gate_proj.bias"] = torch.zeros(384)   # a bias the config does not declare
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"1 checkpoint tensors match nothing.*model\.layers\.0\.mlp\.gate_proj"
                                             r"\.bias"):
        load_model(d)


def test_tied_head_must_equal_the_embedding(tiny, tmp_path):
    d = copy(tiny, tmp_path / "tied")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(ModelLoadError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_model(d)
    state = load_file(str(d / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(d / "model.safetensors"))
    m = load_model(d).model
    assert torch.equal(m.lm_head.weight, m.model.embed_tokens.weight)


def test_index_naming_absent_tensor(tiny, tmp_path):
    d = copy(tiny, tmp_path / "index")
    state = load_file(str(d / "model.safetensors"))
    index = {"weight_map": {**{k: "model.safetensors" for k in state}, "model.extra.weight": "model.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model.safetensors.index.json: 1 tensors it lists are in no shard"):
        load_model(d)


BROKEN = [
    ("truncated safetensors", "model.safetensors", None, "model.safetensors: not a readable safetensors file"),
    ("config.json is a list", "config.json", b"[1, 2]", "config.json: expected a JSON object, got a JSON list"),
    ("invalid JSON", "config.json", b'{"model_type": "qwen3_5_text",', r"config.json: invalid JSON \(.* line 1"),
    ("not UTF-8", "config.json", b"\xff\xfe{}", "config.json: not UTF-8"),
    ("wrong value type", "config.json", None, "config.json: a field has the wrong type"),
    ("invalid tokenizer_config", "tokenizer_config.json", b"{", "tokenizer_config.json: invalid JSON"),
    ("malformed tokenizer", "tokenizer.json", b'{"model": 3}', "tokenizer.json: not a usable tokenizer"),
]


def _break(d, name, data):
    f = d / name
    if data is not None:
        f.write_bytes(data)
    elif name == "model.safetensors":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        cfg = json.loads(f.read_text())
        f.write_text(json.dumps({**cfg, "hidden_size": "128"}))
    return f


@pytest.mark.parametrize("what,name,data,message", BROKEN, ids=[b[0] for b in BROKEN])
@pytest.mark.parametrize("load", [load_model, check_model], ids=["load_model", "check_model"])
def test_broken_file_one_line_naming_it(load, what, name, data, message, tiny, tmp_path):
    d = copy(tiny, tmp_path / "broken")
    f = _break(d, name, data)
    with pytest.raises(ModelLoadError, match=message) as e:
        load(d)
    assert str(e.value).startswith(str(f)) and "\n" not in str(e.value)


def test_check_model_reads_headers_only(tiny, tmp_path, monkeypatch):
    import radixflow.engine.loader as loader

    def no_data(*a, **k):
        raise AssertionError("check_model read tensor data")

    monkeypatch.setattr(loader, "load_file", no_data)
    assert check_model(tiny) == tiny
    d = copy(tiny, tmp_path / "extra")
    state = load_file(str(d / "model.safetensors"))
    save_file({**state, "model.extra.weight": torch.zeros(2)}, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.extra.weight"):
        check_model(d)


@pytest.mark.parametrize("what,name,data,message", BROKEN[:3], ids=[b[0] for b in BROKEN[:3]])
def test_broken_file_cli_exit_2(what, name, data, message, tiny, tmp_path, capsys):
    from radixflow.cli import main

    d = copy(tiny, tmp_path / "broken")
    f = _break(d, name, data)
    for command in (["bench", "--questions", "1"], ["serve", "--port", "0"]):  # serve: before the port opens
        assert main([*command, "--model", str(d)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"radixflow {command[0]}: error: {f}" in err and "Traceback" not in err
