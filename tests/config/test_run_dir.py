"""A run folder of its own (arlopti/config/run_dir.py): two runs started at once never share one.

The two-process test starts two Python processes that each run one Hydra job the way
``arlopti.run`` and ``python train.py`` do (the checkout's configs, ``hydra.run.dir`` from
configs/hydra/default.yaml), released together by a file barrier. The clock Hydra's ``now``
resolver reads is pinned to one instant in both, so they race for exactly the same ``<time>``
folder: a second boundary falling between them cannot hide a clash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arlopti.config.run_dir import claim_dir, task_log_suffix
from conftest import REPO_ROOT

JOB = r'''
import datetime, json, os, sys, time
from pathlib import Path
import hydra.core.utils
from hydra.core.hydra_config import HydraConfig
from arlopti.config.compose import run_job


class Pinned(datetime.datetime):  # what Hydra's `now` resolver reads: one instant for both processes
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 1, 1)


hydra.core.utils.datetime = Pinned
log_dir, barrier, out = sys.argv[1:4]
while not Path(barrier).exists():
    time.sleep(0.005)

def task(cfg):
    Path(out).write_text(json.dumps({"run_dir": HydraConfig.get().runtime.output_dir,
                                     "lightning_sees": HydraConfig.get().run.dir}))

run_job(task, ["debug=smoke", "logger=none", f"paths.log_dir={log_dir}"])
'''


def test_a_taken_name_gives_the_next_free_one(tmp_path):
    first = claim_dir(str(tmp_path / "logs" / "t" / "r" / "2026-01-01_00-00-00"))
    second = claim_dir(str(tmp_path / "logs" / "t" / "r" / "2026-01-01_00-00-00"))
    third = claim_dir(str(tmp_path / "logs" / "t" / "r" / "2026-01-01_00-00-00"))
    assert [Path(p).name for p in (first, second, third)] == ["2026-01-01_00-00-00", "2026-01-01_00-00-00_1",
                                                              "2026-01-01_00-00-00_2"]
    assert all(Path(p).is_dir() for p in (first, second, third))


@pytest.mark.process


def test_two_runs_started_at_once_get_two_folders(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PROJECT_ROOT": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    barrier = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "logs"), str(barrier),
                               str(tmp_path / f"out{i}.json")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    time.sleep(0.5)
    barrier.touch()  # both are waiting at the barrier (or about to): released together
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    got = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    dirs = sorted(g["run_dir"] for g in got)
    base = tmp_path / "logs" / "train" / "s42_smoke" / "2026-01-01_00-00-00"
    assert dirs == [str(base), f"{base}_1"]
    # what Lightning hands the ranks it starts (hydra.run.dir=...) is the folder the run claimed, not a third
    assert all(g["lightning_sees"] == g["run_dir"] for g in got)
    assert sorted(p.name for p in base.parent.iterdir()) == [base.name, base.name + "_1"]
    for d in dirs:
        assert (Path(d) / ".hydra" / "config.yaml").is_file() and (Path(d) / "train.log").is_file()


@pytest.mark.parametrize("env, suffix", [({}, ""), ({"SLURM_PROCID": "3"}, ""),
                                         ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_PROCID": "0"}, ""),
                                         ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_PROCID": "3"}, "_rank3"),
                                         ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "1"}, "_rank1")])
def test_only_the_other_tasks_of_a_submitit_job_log_to_a_file_of_their_own(env, suffix, monkeypatch):
    for var in ("SUBMITIT_EXECUTOR", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert task_log_suffix() == suffix
