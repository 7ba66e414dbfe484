"""Readable runs: the step count and ETA by hand, the metrics line, and a real non-TTY
``train.py`` run whose ``train.log`` holds one metrics line per step and no line twice."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter

import pytest

from arlopti.callbacks.progress import (StepLine, clip_fraction, eta_seconds, format_duration, format_line,
                                        planned_steps)
from conftest import REPO_ROOT


def test_planned_steps():
    assert planned_steps(2, 1, 2250) == 2  # the old bar read 2/2250 for this run
    assert planned_steps(None, 3, 10) == 30  # the epochs' total
    assert planned_steps(100, 2, 10) == 20  # the epochs end first
    assert planned_steps(None, -1, 10) == math.inf and planned_steps(None, 1, math.inf) == math.inf
    assert planned_steps(5, -1, None) == 5


def test_eta_is_the_mean_step_time_of_this_process():
    assert eta_seconds(3, 10, 0, 30.0) == pytest.approx(70.0)  # 7 steps left x 10 s
    assert eta_seconds(5, 10, 3, 20.0) == pytest.approx(50.0)  # resumed at 3: 2 steps took 20 s
    assert eta_seconds(3, 3, 0, 30.0) == 0.0
    assert eta_seconds(0, 10, 0, 5.0) is None and eta_seconds(2, math.inf, 0, 5.0) is None
    assert format_duration(3725) == "1:02:05" and format_duration(90000) == "1 d 1:00:00"
    assert format_duration(None) == "?"


def test_format_line_by_hand():
    m = {"reward/mean": -1.25, "reward/accuracy": 0.125, "update/kl": 0.001, "update/entropy": 1.2345,
         "update/clip_frac_low": 0.01, "update/clip_frac_high": 0.02, "update/clip_frac_dual": 0.0,
         "rollout/response_len_mean": 85.4, "timing/tokens_per_s": 312.4}
    assert clip_fraction(m) == pytest.approx(0.03)
    assert format_line(3, 10, m, 4.06, 29.0) == (
        "step 3/10 | reward -1.250 | acc 0.125 | kl 1.00e-03 | ent 1.234 | clip 0.030 | len 85 | tok/s 312 | "
        "4.1 s/step | ETA 0:00:29")
    assert format_line(1, math.inf, {"reward/mean": 0.0}, None, None) == "step 1/? | reward 0.000 | ETA ?"


def test_every_n_steps_is_checked():
    with pytest.raises(ValueError, match="callbacks.step_line.every_n_steps"):
        StepLine(every_n_steps=0)


LOG_PREFIX = re.compile(r"^\[[^\]]+\]\[([^\]]+)\]\[[A-Z]+\] - ")


def test_non_tty_run_logs_one_line_per_step_and_nothing_twice(tmp_path):
    """The real command line with stdout a pipe (no TTY), as under SLURM."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), "experiment=kk_grpo", "debug=smoke",
                           "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1", "rollout_steps=3",
                           "~callbacks.benchmark_eval", "logger=csv", f"hydra.run.dir={run}"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    log_lines = (run / "train.log").read_text().splitlines()
    steps = [ln for ln in log_lines if "[arlopti.progress]" in ln]
    assert [re.search(r"step (\d+)/(\d+)", ln).groups() for ln in steps] == [("1", "3"), ("2", "3"), ("3", "3")]
    assert all(" | reward " in ln and " | tok/s " in ln and " | ETA " in ln for ln in steps)
    # no message twice, in train.log or on the console (the doubling printed "INFO: <msg>" beside Hydra's line)
    for lines in (log_lines, proc.stdout.splitlines()):
        messages = [LOG_PREFIX.sub("", ln) for ln in lines if LOG_PREFIX.match(ln)]
        assert messages and not [m for m, c in Counter(messages).items() if c > 1]
    console = proc.stdout
    assert sum(ln in console for ln in steps) == 3
    assert not re.search(r"^INFO: ", console, re.M), "Lightning's own handler still prints"
    assert "💡" not in console and "LeafSpec" not in console and "in eval mode at the start" not in console
    assert re.search(r"rollout steps .* 3/3 ", console)  # the bar counts rollout steps
