"""Readable runs: the step count and ETA by hand, the metrics line, and a real non-TTY
``train.py`` run whose ``train.log`` holds one metrics line per step and no line twice."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter

import pytest

from arlopti.callbacks.progress import (StepLine, clip_fraction, eta_seconds, format_compact, format_duration,
                                        format_line, line_style,
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
    failing = {"reward/mean": 0.0, "reward/error": 0.75, "reward/timeout": 0.25}
    assert format_line(1, 2, failing, None, None) == "step 1/2 | reward 0.000 | reward_err 1.000 | ETA ?"


def test_compact_line_fits_80_columns_and_long_needs_a_wide_terminal():
    m = {"reward/mean": -1.25, "reward/accuracy": 0.125, "update/kl": 0.001, "update/entropy": 1.2345,
         "update/clip_frac_low": 0.01, "rollout/response_len_mean": 85.4, "timing/tokens_per_s": 312.4}
    assert format_compact(3, 10, m, 4.06, 29.0) == (
        "step 3/10 rew -1.250 acc 0.125 kl 1.0e-03 len 85 ETA 0:00:29")
    worst = {**m, "reward/mean": -9.125, "update/kl": 1.5e-10, "reward/error": 0.5, "reward/accuracy": 1.0,
             "rollout/response_len_mean": 32768}
    assert len(format_compact(9_999, 9_999, worst, 9999.9, 86399)) <= 80
    assert "err 0.50" in format_compact(1, 2, worst, None, None)
    assert line_style(80) == "compact" and line_style(159) == "compact" and line_style(200) == "long"
    with pytest.raises(ValueError, match="callbacks.step_line.style"):
        StepLine(style="wide")


def test_the_step_line_shows_the_turns_of_a_multi_turn_step():
    m = {"reward/mean": 0.5, "rollout/response_len_mean": 40.0, "turns/mean": 2.25}
    assert format_line(1, 2, m, None, None) == "step 1/2 | reward 0.500 | len 40 | turns 2.25 | ETA ?"
    assert format_compact(1, 2, m, None, None) == "step 1/2 rew 0.500 len 40 turns 2.2 ETA ?"
    single = {k: v for k, v in m.items() if k != "turns/mean"}
    assert "turns" not in format_line(1, 2, single, None, None) + format_compact(1, 2, single, None, None)
    worst = {"reward/mean": -9.125, "reward/error": 0.5, "reward/accuracy": 1.0, "update/kl": 1.5e-10,
             "rollout/response_len_mean": 32768, "turns/mean": 99.0}
    line = format_compact(9_999, 9_999, worst, 9999.9, 86399)  # the turns field would pass 80 columns: left out
    assert len(line) <= 80 and "turns" not in line and "len 32768" in line


def test_a_step_without_a_learning_signal_says_so_and_a_run_of_them_warns(caplog):
    """Issue 38: every group's rewards equal (zero_std_group_frac = 1) means every advantage is 0."""
    from types import SimpleNamespace

    from arlopti.callbacks.progress import NO_SIGNAL_WARN_AFTER, no_signal

    flat = {"reward/mean": -3.0, "reward/std": 0.0, "reward/zero_std_group_frac": 1.0, "reward/accuracy": 0.0}
    spread = {**flat, "reward/std": 1.5}  # every group flat, but the groups differ
    assert no_signal(flat) and no_signal(spread) and not no_signal({**flat, "reward/zero_std_group_frac": 0.75})
    assert no_signal(flat, "reinforce_pp") and not no_signal(spread, "reinforce_pp")  # a batch baseline
    assert not no_signal({"reward/mean": 0.0})
    assert format_line(1, 2, {**flat, "no_signal": True}, None, None) == (
        "step 1/2 | reward -3.000 | no signal | acc 0.000 | ETA ?")
    assert format_compact(1, 2, {**flat, "no_signal": True}, None, None) == "step 1/2 rew -3.000 (no signal) ETA ?"
    worst = {"reward/mean": -9.125, "reward/error": 0.5, "update/kl": 1.5e-10, "rollout/response_len_mean": 32768,
             "no_signal": True}
    assert len(format_compact(9_999, 9_999, worst, 9999.9, 86399)) <= 80

    class Trainer(SimpleNamespace):  # weak-referenceable, as Lightning's Trainer is
        pass

    line = StepLine(style="compact")
    trainer = Trainer(global_rank=0, max_epochs=1, num_training_batches=10, should_stop=False)
    line.on_train_start(trainer, SimpleNamespace(rollout_step=0))
    with caplog.at_level("INFO"):
        for step, m in enumerate([flat] * (NO_SIGNAL_WARN_AFTER - 1) + [{**flat, "reward/zero_std_group_frac": 0.5}]
                                 + [flat] * (NO_SIGNAL_WARN_AFTER + 1), start=1):
            module = SimpleNamespace(rollout_step=step, total_rollout_steps=10, cfg=None,
                                     last_step_context=SimpleNamespace(metrics=m))
            line.on_train_batch_end(trainer, module, None, None, step - 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    last = 2 * NO_SIGNAL_WARN_AFTER + 1
    assert len(warnings) == 1, warnings  # once per run of flat steps, and a short run gives none
    assert warnings[0].startswith(f"rollout steps {NO_SIGNAL_WARN_AFTER + 1}-{last - 1} had no learning signal: in "
                                  "every group all responses got the same reward (mean reward -3.000)")
    assert "tiny random model scores -3 on every K&K response" in warnings[0]
    assert sum("(no signal)" in r.getMessage() for r in caplog.records if r.name == "arlopti.progress") == last - 1


def test_lightnings_max_epochs_line_names_rollout_steps_when_they_stopped_the_run():
    """Issue 38: rollout_steps (or a signal) stops the run mid-epoch, and Lightning still said max_epochs."""
    import logging
    from types import SimpleNamespace

    from arlopti.utils.console import FitStopReason, watch_fit_stop

    class Trainer(SimpleNamespace):  # weak-referenceable, as Lightning's Trainer is
        pass

    def line(**state):
        stop = state.pop("stop", True)
        module = SimpleNamespace(rollout_step=2, total_rollout_steps=2, preempted=False)
        module.__dict__.update(state)
        trainer = Trainer(should_stop=stop, lightning_module=module)
        watch_fit_stop(trainer)
        record = logging.LogRecord("lightning.pytorch.utilities.rank_zero", logging.INFO, __file__, 1,
                                   "`Trainer.fit` stopped: `max_epochs=1` reached.", (), None)
        return record.getMessage() if FitStopReason().filter(record) else None

    assert line() == "`Trainer.fit` stopped: `rollout_steps=2` reached."
    assert line(preempted=True) is None  # the checkpoint callback said why
    assert line(stop=False) == "`Trainer.fit` stopped: `max_epochs=1` reached."  # the epochs did end it
    assert line(rollout_step=1) == "`Trainer.fit` stopped: `max_epochs=1` reached."  # another callback stopped it


def test_every_n_steps_is_checked():
    with pytest.raises(ValueError, match="callbacks.step_line.every_n_steps"):
        StepLine(every_n_steps=0)


LOG_PREFIX = re.compile(r"^\[[^\]]+\]\[([^\]]+)\]\[[A-Z]+\] - ")


@pytest.mark.process


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
    # no TTY: the 80-column form, never wrapped
    assert all(" rew " in ln and " ETA " in ln and " | " not in ln for ln in steps)
    assert all(len(LOG_PREFIX.sub("", ln)) <= 80 for ln in steps)
    # no message twice, in train.log or on the console (the doubling printed "INFO: <msg>" beside Hydra's line)
    for lines in (log_lines, proc.stdout.splitlines()):
        messages = [LOG_PREFIX.sub("", ln) for ln in lines if LOG_PREFIX.match(ln)]
        assert messages and not [m for m, c in Counter(messages).items() if c > 1]
    console = proc.stdout
    # on the console the step line comes bare (no Hydra prefix), so the compact form fits 80 columns
    console_lines = console.splitlines()
    assert all(LOG_PREFIX.sub("", ln) in console_lines for ln in steps)
    assert not [ln for ln in console_lines if "[arlopti.progress]" in ln]
    assert not re.search(r"^INFO: ", console, re.M), "Lightning's own handler still prints"
    assert "💡" not in console and "LeafSpec" not in console and "in eval mode at the start" not in console
    assert re.search(r"rollout steps .* 3/3 ", console)  # the bar counts rollout steps
    # rollout_steps=3 stops the run mid-epoch: Lightning's closing line says so, not "max_epochs=1 reached"
    assert "`Trainer.fit` stopped: `rollout_steps=3` reached." in console and "max_epochs=1" not in console
    # logger=csv: the csv hint on one line, no TensorBoard hint (no such folder)
    assert f"CSV: {run / 'csv' / 'metrics.csv'}\n" in console
    assert "tensorboard --logdir" not in console and not (run / "tensorboard").exists()
    # metrics.csv: one row per rollout step (learner, diagnostics: one row)
    import csv

    rows = list(csv.DictReader(open(run / "csv" / "metrics.csv")))
    assert [r["step"] for r in rows] == ["1", "2", "3"] and all(r["reward/mean"] for r in rows)


def test_the_worker_side_of_a_server_step_is_on_the_long_line():
    m = {"reward/mean": -1.25, "async/staleness_max": 1.0, "async/trainer_wait_s": 0.31,
         "async/worker_idle_s": 0.12, "async/queue_depth": 2.0, "async/worker0/tokens_per_s": 200.4,
         "async/worker1/tokens_per_s": 140.0}
    assert format_line(3, 10, m, None, 29.0) == (
        "step 3/10 | reward -1.250 | stale 1 | wait 0.3 s | idle 0.1 s | queue 2 | worker tok/s 340 | ETA 0:00:29")
    assert format_compact(3, 10, m, None, 29.0) == "step 3/10 rew -1.250 ETA 0:00:29"  # 80 columns: no room


@pytest.mark.parametrize("custom, shows", [(None, True), ({"reward_fn": "r.py:f"}, True),
                                           ({"reward_model": "rm", "reward_fns": ["r.py:f"]}, True),
                                           ({"reward_model": "rm", "reward_fn": None, "reward_fns": None}, False)])
def test_accuracy_is_on_the_line_only_where_the_task_defines_it(custom, shows, caplog):
    """Issue 54 item 3: a reward model alone scores on its own scale; ``acc 0.000`` (reward > 0) on every
    line said nothing. Built-in tasks and reward functions keep it."""
    from types import SimpleNamespace

    class Trainer(SimpleNamespace):  # weak-referenceable, as Lightning's Trainer is
        pass

    metrics = {"reward/mean": 1.25, "reward/std": 0.5, "reward/zero_std_group_frac": 0.0, "reward/accuracy": 0.0}
    trainer = Trainer(global_rank=0, max_epochs=1, num_training_batches=10, should_stop=False)
    options = {"kk": {}, "custom": custom}
    line = StepLine(style="compact")
    line.on_train_start(trainer, SimpleNamespace(rollout_step=0, task_options=options))
    module = SimpleNamespace(rollout_step=1, total_rollout_steps=10, cfg=None, task_options=options,
                             last_step_context=SimpleNamespace(metrics=metrics))
    with caplog.at_level("INFO"):
        line.on_train_batch_end(trainer, module, None, None, 0)
    (text,) = [r.getMessage() for r in caplog.records if r.name == "arlopti.progress"]
    assert text.startswith("step 1/") and ("acc 0.000" in text) == shows, text
