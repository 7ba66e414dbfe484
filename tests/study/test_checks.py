"""``arlopti study <part>`` refuses a numeric option out of its range at the start, in one line (issue 42 item 5).

Before, ``study toy --steps -1`` trained a run and then ended in a traceback
(``RuntimeError: the run stopped after 1 of -1 rollout steps``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from arlopti.study.__main__ import main
from arlopti.config.cli_report import run_command


@pytest.mark.process
@pytest.mark.parametrize("command", [["arlopti.study"], ["arlopti.analysis", "study"]])  # the old name too
def test_study_toy_negative_steps_is_one_line_before_anything_runs(command, tmp_path):
    out = tmp_path / "toy"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", *command, "toy", "--steps", "-1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("ConfigError: --steps -1:") and "--steps 1 or more" in lines[0]
    assert not out.exists()  # refused before the warm start or any run


@pytest.mark.parametrize("argv, flag", [
    (["toy", "--seeds", "1"], "--seeds 1"),
    (["toy", "--lr", "0"], "--lr 0"),
    (["toy", "--lr", "nan"], "--lr nan"),
    (["toy", "--warm-start-steps", "-3"], "--warm-start-steps -3"),
    (["toy", "--final-window", "0"], "--final-window 0"),
    (["toy", "--steps", "3", "--final-window", "5"], "--final-window 5"),
    (["toy", "--threshold", "1.5"], "--threshold 1.5"),
    (["toy", "--workers", "0"], "--workers 0"),
    (["toy", "--threads", "0"], "--threads 0"),
    (["kk-mechanism", "--batches", "0"], "--batches 0"),
    (["kk-mechanism", "--first-batch", "-1"], "--first-batch -1"),
    (["kk-mechanism", "--prompts", "0"], "--prompts 0"),
    (["kk-mechanism", "--group-size", "0"], "--group-size 0"),
    (["kk-mechanism", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["kk-mechanism", "--temperature", "-0.5"], "--temperature -0.5"),
    (["kk-mechanism", "--micro-batch", "0"], "--micro-batch 0"),
    (["kk-run", "--method", "grpo", "--seed", "-1"], "--seed -1"),
    (["kk-run", "--method", "grpo", "--seed", "0", "--val-per-n", "0"], "--val-per-n 0"),
    (["kk-report", "--threads", "-2"], "--threads -2"),
])
def test_each_numeric_option_out_of_range_is_refused_naming_it(argv, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = tmp_path / "out"
    assert run_command(main, [*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ConfigError: {flag}:"), err
    assert "give" in err[0]  # the fix
    assert not out.exists()
