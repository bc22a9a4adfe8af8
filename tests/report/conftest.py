"""One quick-preset results directory shared by the report tests (built once per session)."""

from __future__ import annotations

import shutil

import pytest

from radixflow.report.experiment import preset, run_experiment


@pytest.fixture(scope="session")
def quick_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("quick")
    rep = run_experiment(preset("quick"), root, jobs=2)
    assert not rep.failed, rep.failed
    return root


@pytest.fixture
def quick_copy(quick_dir, tmp_path):
    """A private copy to damage."""
    dst = tmp_path / "results"
    shutil.copytree(quick_dir, dst)
    return dst
