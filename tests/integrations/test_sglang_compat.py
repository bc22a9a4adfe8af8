"""The SGLang version guard and refusals (no SGLang needed), and the plugin entry point."""

from __future__ import annotations

from importlib import metadata

import pytest

from radixflow.integrations.sglang import compat


def _version(v):
    def fake(name):
        if name != "sglang":
            return metadata.version(name)
        if v is None:
            raise metadata.PackageNotFoundError(name)
        return v
    return fake


def test_other_versions_are_refused_in_one_line_naming_the_supported_one(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", _version("0.5.22"))
    with pytest.raises(compat.UnsupportedSglangError) as e:
        compat.require_supported_sglang()
    msg = str(e.value)
    assert "\n" not in msg and "0.5.23 only" in msg and "0.5.22" in msg


def test_missing_sglang_says_how_to_install(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", _version(None))
    with pytest.raises(compat.UnsupportedSglangError, match=r"radixflow\[sglang\]"):
        compat.require_supported_sglang()


def test_local_build_tags_are_the_supported_version(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", _version("0.5.23+cu130"))
    assert compat.require_supported_sglang() == "0.5.23+cu130"


@pytest.mark.parametrize("kw,word", [({"hicache": True}, "HiCache"), ({"kv_shards": 4}, "sharding"),
                                     ({"int8_mamba": True}, "int8"), ({"session_refs": True}, "session")])
def test_what_the_backend_cannot_honour_is_refused_with_a_message(kw, word):
    args = {"hicache": False, "kv_shards": 1, "int8_mamba": False, "session_refs": False, **kw}
    assert word in compat.refusal(**args)
    assert compat.refusal(hicache=False, kv_shards=1, int8_mamba=False, session_refs=False) is None


def test_pyproject_declares_the_plugin_entry_point():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert data["project"]["entry-points"]["sglang.srt.plugins"]["radixflow"] == (
        "radixflow.integrations.sglang:register")
    assert data["project"]["optional-dependencies"]["sglang"] == [f"sglang=={compat.SUPPORTED_SGLANG_VERSION}"]
