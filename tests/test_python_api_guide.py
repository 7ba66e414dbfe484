"""docs/python_api.md runs as written: its script trains the tiny model 2 steps through
``arlopti.run`` with two weighted rewards, one a callable from a module file (the worker pool), one
defined in the script (in-process), on a list of dicts; the printed result is checked here.

The page is run as docs/custom_task.md is (``test_custom_task_guide.guide_script``): ``file=``
blocks are written, ``bash`` blocks run, in a temporary folder standing for the checkout's root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_custom_task_guide import guide_blocks, run_guide

GUIDE = REPO_ROOT / "docs" / "python_api.md"


def test_guide_has_a_script_with_two_weighted_rewards():
    blocks = guide_blocks(GUIDE.read_text())
    files = [p for _, _, p in blocks if p]
    assert files == ["my_rewards.py", "train_two_rewards.py"]
    script = next(body for _, body, p in blocks if p == "train_two_rewards.py")
    assert "arlopti.run(" in script and "reward_weights=[1.0, 0.5]" in script and "train_data=rows" in script


@pytest.mark.slow
def test_python_api_guide_runs_as_written(tmp_path):
    proc = run_guide(GUIDE, tmp_path, ("configs",))
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"run_dir"')]
    result = json.loads(line)
    run_dir = Path(result["run_dir"])
    assert run_dir.parent.parent == tmp_path / "logs" / "two_rewards" and (run_dir / ".hydra" / "config.yaml").is_file()
    assert Path(result["checkpoint"]) == run_dir / "checkpoints" / "last.ckpt" and Path(result["checkpoint"]).is_file()
    m = result["metrics"]
    assert {"reward/correct", "reward/brevity", "reward/correct.answered", "reward/error"} <= set(m)
    assert m["reward/brevity"] < 0 and m["reward/error"] == 0.0
    assert m["reward/mean"] == pytest.approx(1.0 * m["reward/correct"] + 0.5 * m["reward/brevity"], abs=1e-5)
    # the same step lines as the command line, on the console and in train.log
    assert "step 2/2" in proc.stdout and "step 2/2" in (run_dir / "train.log").read_text()
