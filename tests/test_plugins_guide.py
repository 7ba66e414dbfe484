"""docs/plugins.md runs as written: a policy loss registered from the user's own module trains the tiny
model 2 steps under Lopti through ``arlopti.run``, with no file under ``src/`` touched.

The page is run as docs/custom_task.md is (``test_custom_task_guide.guide_script``): ``file=`` blocks are
written, ``bash`` blocks run, in a temporary folder standing for the checkout's root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_custom_task_guide import guide_blocks, guide_script

GUIDE = REPO_ROOT / "docs" / "plugins.md"


def test_guide_registers_a_loss_and_names_it():
    blocks = guide_blocks(GUIDE.read_text())
    assert [p for _, _, p in blocks if p] == ["my_losses.py", "train_my_loss.py"]
    script = next(body for _, body, p in blocks if p == "train_my_loss.py")
    assert "import my_losses" in script and "algorithm.policy_loss=truncated_is" in script


@pytest.mark.slow
def test_plugins_guide_runs_as_written(tmp_path):
    (tmp_path / "configs").symlink_to(REPO_ROOT / "configs")
    env = dict(os.environ, PROJECT_ROOT=str(tmp_path), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (tmp_path / "guide.sh").write_text(guide_script(GUIDE.read_text()))
    proc = subprocess.run(["bash", "guide.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"run_dir"')]
    result = json.loads(line)
    run_dir = Path(result["run_dir"])
    assert run_dir.parent.name.startswith("truncated_is_e0.5"), run_dir
    assert "policy_loss: truncated_is" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert result["steps"] >= 1  # optimizer steps of the last rollout step (both phases when both have tokens)


def test_the_command_line_refuses_an_unregistered_loss():
    """What the page says train.py cannot do: the config check names the loss and the known ones."""
    from arlopti.config import ConfigError, RunConfig, validate_run

    cfg = RunConfig()
    cfg.algorithm.policy_loss = "truncated_is_not_registered"
    with pytest.raises(ConfigError, match="algorithm.policy_loss='truncated_is_not_registered'.*ppo_clip"):
        validate_run(cfg)
