"""Sweeps and launches through Hydra's maintained plugins, end to end on CPU, on the tiny model, in one
sweep: an Optuna search (``hparams_search=kk_ar_lopti_optuna``, hydra-optuna-sweeper) whose 2 trials
run at once as ``hydra/launcher=submitit_local`` jobs (hydra-submitit-launcher), in processes of their
own. The sampler (seed 0) gives trial 1 ``optim.lr=1e38``: it is refused at start-up and recorded as
failed, without losing trial 0. Trial 0 gets submitit's preemption signal (SIGUSR2) after its first
rollout step, saves its checkpoint, is requeued by submitit and resumes from it with ``ckpt_path=auto``.
Checked: each trial's own run folder, the study's own record (its sqlite storage) of what each trial
returned, and the multirun summary against each run's own ``summary.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO_ROOT
from helpers.train_cli import SMOKE


def sweep_dir(log_dir: Path, task: str) -> Path:
    (found,) = (log_dir / task / "multiruns").iterdir()
    return found


def assert_summary_matches_the_runs(summary: dict) -> None:
    """Every completed job's row holds its own summary.json's final numbers."""
    for row in summary["jobs"]:
        if row["status"] != "completed":
            continue
        run = json.loads((Path(row["dir"]) / "summary.json").read_text())
        assert row["metrics"]["rollout_steps"] == run["rollout_steps"]
        for part in ("end", "eval_last"):
            for k, v in run[part].items():
                if k != "rollout_step":
                    assert row["metrics"][k] == v, (row["job"], k)


def task_process_of(root_pid: int, log_file: Path):
    """The process (under ``root_pid``) that writes ``log_file``: a submitit task running a job."""
    import psutil

    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if any(Path(f.path) == log_file for f in p.open_files()):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if path.is_file() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended (rc {proc.returncode}) before {path} showed {text!r}: "
                                 + proc.stderr.read()[-3000:])
        time.sleep(0.1)
    raise AssertionError(f"{path} did not show {text!r} within {timeout} s")


@pytest.mark.slow
@pytest.mark.distributed
def test_an_optuna_search_on_submitit_records_a_failed_trial_and_requeues_a_preempted_one(tmp_path):
    import optuna

    db = tmp_path / "optuna.db"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT / "tests")}
    cmd = [sys.executable, "train.py", "hparams_search=kk_ar_lopti_optuna", "hydra/launcher=submitit_local", *SMOKE,
           "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2", "hydra.sweeper.sampler.seed=0",
           "optim.lr=choice(1e-6,1e38)", f"hydra.sweeper.storage=sqlite:///{db}", "rollout_steps=3",
           "ckpt_path=auto", "optimized_metric=reward/mean", f"paths.log_dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        root = tmp_path / "kk_ar_lopti" / "multiruns"
        end = time.time() + 120
        while not (root.is_dir() and any(root.iterdir())) and time.time() < end:
            time.sleep(0.1)
        sweep = sweep_dir(tmp_path, "kk_ar_lopti")
        log = sweep / "0" / "train.log"
        wait_for(log, "step 1/3", proc)
        task = task_process_of(proc.pid, log)
        assert task is not None, "no process writes trial 0's train.log"
        task.send_signal(signal.SIGUSR2)  # what submitit sends signal_delay_s before a time limit
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]  # the search records a failed trial and goes on
    summary = json.loads((sweep / "multirun_summary.json").read_text())
    done, failed = summary["jobs"]
    assert (done["status"], done["swept"]["optim.lr"]) == ("completed", "1e-06")
    assert (failed["status"], failed["swept"]["optim.lr"]) == ("failed", "1e+38")
    assert failed["error"].startswith("ConfigError: optim.lr=1e+38 is too large")
    assert {"algorithm.ar_alpha", "algorithm.lopti.eta", "optim.lr"} <= set(summary["swept_keys"])
    # each trial ran in its own folder, with its own sampled values
    for row in (done, failed):
        overrides = OmegaConf.to_container(OmegaConf.load(sweep / row["job"] / ".hydra" / "overrides.yaml"))
        assert f"algorithm.ar_alpha={row['overrides']['algorithm.ar_alpha']}" in overrides
    assert (sweep / "0" / "checkpoints" / "last.ckpt").is_file()
    assert not (sweep / "1" / "checkpoints" / "last.ckpt").exists()  # refused before any step
    assert_summary_matches_the_runs(summary)
    assert done["metrics"]["rollout_steps"] == 3 and done["objective"] == done["metrics"]["reward/mean"]
    # the sweeper saw what each trial returned: the study's own record
    study = optuna.load_study(study_name="kk_ar_lopti", storage=f"sqlite:///{db}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL"]
    assert study.trials[0].value == done["objective"]
    assert study.trials[0].params["algorithm.ar_alpha"] == pytest.approx(float(done["overrides"]["algorithm.ar_alpha"]))
    assert OmegaConf.load(sweep / "optimization_results.yaml").best_value == done["objective"]
    assert "multirun: 1 completed, 1 failed" in out
    # trial 0: stopped by the signal after its checkpoint, requeued, resumed (both attempts log here)
    text = log.read_text()
    assert "received SIGUSR2: checkpointing after the current rollout step" in text
    assert "handing SIGUSR2 to submitit to requeue the job" in text
    assert f"resuming from {sweep / '0' / 'checkpoints' / 'last.ckpt'}" in text
    assert not (sweep / "0" / "checkpoints" / "PREEMPTED").exists()  # the resumed run ended normally
