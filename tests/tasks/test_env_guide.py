"""docs/multi_turn.md runs as written: its example environment, reward and prompts, then 2 training steps of
the tiny model with 3-turn episodes, from an empty folder (as tests/test_custom_task_guide.py runs
docs/custom_task.md: the same block rules, the same folder set-up)."""

from __future__ import annotations

import csv

import pytest

from conftest import REPO_ROOT
from test_custom_task_guide import guide_blocks, run_guide

GUIDE = REPO_ROOT / "docs" / "multi_turn.md"


def test_the_page_writes_its_files_outside_src_and_trains():
    blocks = guide_blocks(GUIDE.read_text())
    assert [p for _, _, p in blocks if p] == ["my_env/guess.py", "my_env/rewards.py", "my_env/train.jsonl"]
    commands = [body for lang, body, _ in blocks if lang == "bash"]
    assert any("task.env=my_env/guess.py:Guess" in c and "rollout.max_turns=3" in c for c in commands)


@pytest.mark.slow
def test_the_multi_turn_guide_runs_as_written(tmp_path):
    run_guide(GUIDE, tmp_path, ("train.py", "eval.py", "configs"))
    (metrics,) = (tmp_path / "logs" / "my_env").glob("*/*/**/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("turns/mean")]
    assert len(rows) == 2 and all(float(r["turns/mean"]) > 1 for r in rows)
    assert all(float(r["turns/env_token_frac"]) > 0 for r in rows)
