"""``configs/local/`` (configs/local/README.md): a per-machine file that ``train.yaml`` composes when it
exists (``- optional local: default``), after the experiment, before the command line.

Each test composes a copy of ``configs/`` in ``tmp_path`` (the repository's own ``configs/local`` stays
untouched, and any file a developer keeps there is left out of the copy)."""

from __future__ import annotations

import shutil

import pytest

from arlopti.config.compose import compose
from conftest import REPO_ROOT

MACHINE = """# @package _global_
paths:
  shared_dir: /datasets/arlopti/shared
optim:
  lr: 3.0e-5
"""


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """A copy of ``configs/`` without local files; PROJECT_ROOT pinned so nothing leaks to later tests."""
    monkeypatch.setenv("PROJECT_ROOT", str(REPO_ROOT))
    copy = tmp_path / "configs"
    shutil.copytree(REPO_ROOT / "configs", copy)
    for own in (copy / "local").glob("*.yaml"):
        own.unlink()
    return copy


def test_without_a_local_file_the_run_composes_as_before(configs):
    cfg = compose(["experiment=kk_lopti"], config_dir=configs)
    assert cfg.optim.lr == 1e-6 and cfg.paths.shared_dir != "/datasets/arlopti/shared"


def test_a_local_default_yaml_is_composed_after_the_experiment_and_before_the_command_line(configs):
    (configs / "local" / "default.yaml").write_text(MACHINE)
    (configs / "local" / "cluster_b.yaml").write_text(MACHINE.replace("3.0e-5", "7.0e-5"))
    cfg = compose(["experiment=kk_lopti"], config_dir=configs)
    assert cfg.paths.shared_dir == "/datasets/arlopti/shared"
    assert cfg.optim.lr == 3e-5  # the machine's file wins over the experiment's 1e-6
    assert compose(["experiment=kk_lopti", "optim.lr=0.5"], config_dir=configs).optim.lr == 0.5
    assert compose(["experiment=kk_lopti", "local=cluster_b"], config_dir=configs).optim.lr == 7e-5
