"""docs/multi_turn.md runs as written: its example environment, reward and prompts, then 2 training steps of
the tiny model with 3-turn episodes, from an empty folder (as tests/test_custom_task_guide.py runs
docs/custom_task.md: the same block rules, the same folder set-up)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_custom_task_guide import guide_blocks, guide_script

GUIDE = REPO_ROOT / "docs" / "multi_turn.md"


def test_the_page_writes_its_files_outside_src_and_trains():
    blocks = guide_blocks(GUIDE.read_text())
    assert [p for _, _, p in blocks if p] == ["my_env/guess.py", "my_env/rewards.py", "my_env/train.jsonl"]
    commands = [body for lang, body, _ in blocks if lang == "bash"]
    assert any("task.env=my_env/guess.py:Guess" in c and "rollout.max_turns=3" in c for c in commands)


@pytest.mark.slow
def test_the_multi_turn_guide_runs_as_written(tmp_path):
    for name in ("train.py", "eval.py", "configs"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    env = dict(os.environ, PROJECT_ROOT=str(tmp_path), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (tmp_path / "guide.sh").write_text(guide_script(GUIDE.read_text()))
    proc = subprocess.run(["bash", "guide.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (metrics,) = (tmp_path / "logs" / "my_env").glob("*/*/**/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("turns/mean")]
    assert len(rows) == 2 and all(float(r["turns/mean"]) > 1 for r in rows)
    assert all(float(r["turns/env_token_frac"]) > 0 for r in rows)
