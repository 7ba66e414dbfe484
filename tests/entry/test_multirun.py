"""A multirun folder's summary (arlopti/entry/multirun.py), built from job folders laid out as Hydra
and the run write them: ``.hydra/overrides.yaml``, ``job_status.json``, ``summary.json``. The real
sweeps that write such folders are tests/entry/test_sweeps.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from arlopti.entry.failures import JobFailed
from arlopti.entry.multirun import job_status, markdown, summarise, write_summary


def make_job(sweep: Path, n: int, overrides: list[str], status: dict | None, reward: float | None):
    d = sweep / str(n)
    (d / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), d / ".hydra" / "overrides.yaml")
    if status is not None:
        (d / "job_status.json").write_text(json.dumps(status))
    if reward is not None:
        (d / "summary.json").write_text(json.dumps({
            "rollout_steps": 2, "start": {"reward/mean": -1.0}, "end": {"reward/mean": reward, "reward/accuracy": 0.5},
            "eval_first": {}, "eval_last": {"rollout_step": 2, "val/kk/mean/greedy/acc": reward / 10}}))


@pytest.fixture()
def sweep(tmp_path):
    s = tmp_path / "multiruns" / "t"
    done = {"status": "completed"}
    make_job(s, 0, ["debug=smoke", "algorithm.ar_alpha=0.1", "seed=1"], {**done, "objective": 0.1}, 1.0)
    make_job(s, 1, ["debug=smoke", "algorithm.ar_alpha=0.1", "seed=2"], {**done, "objective": 0.3}, 3.0)
    make_job(s, 2, ["debug=smoke", "algorithm.ar_alpha=0.3", "seed=1"], {**done, "objective": 0.2}, 2.0)
    make_job(s, 3, ["debug=smoke", "algorithm.ar_alpha=0.3", "seed=2"],
             {"status": "failed", "error": "ConfigError: optim.lr=1e+38 is too large"}, None)
    make_job(s, 4, ["debug=smoke", "algorithm.ar_alpha=0.5", "seed=1"], None, None)  # killed: no status
    (s / ".submitit").mkdir()  # not a job
    return s


def test_the_summary_lists_every_job_with_its_swept_values_and_its_own_numbers(sweep):
    s = write_summary(sweep)
    assert s["swept_keys"] == ["algorithm.ar_alpha", "seed"]  # debug=smoke is common to all: not swept
    assert [r["job"] for r in s["jobs"]] == ["0", "1", "2", "3", "4"]
    assert [r["status"] for r in s["jobs"]] == ["completed"] * 3 + ["failed", "no result"]
    assert s["counts"] == {"completed": 3, "failed": 1, "interrupted": 0, "no result": 1}
    for r in s["jobs"]:
        own = sweep / r["job"] / "summary.json"
        if own.is_file():  # the row's numbers are the run's own summary.json, end and last validation
            run = json.loads(own.read_text())
            assert r["metrics"]["reward/mean"] == run["end"]["reward/mean"]
            assert r["metrics"]["val/kk/mean/greedy/acc"] == run["eval_last"]["val/kk/mean/greedy/acc"]
            assert "rollout_step" not in r["metrics"]
        else:
            assert r["metrics"] == {}
    assert s["jobs"][3]["error"] == "ConfigError: optim.lr=1e+38 is too large"
    assert json.loads((sweep / "multirun_summary.json").read_text())["counts"] == s["counts"]
    md = (sweep / "multirun_summary.md").read_text()
    assert "| 3 | failed: ConfigError: optim.lr=1e+38 is too large | 0.3 | 2 |" in md
    assert "| 4 | no result | 0.5 | 1 |" in md


def test_seeds_of_the_same_settings_get_a_mean_and_the_projects_bootstrap_ci(sweep):
    from arlopti.eval.compare import bootstrap_diffs

    (group,) = summarise(sweep)["seed_groups"]  # alpha 0.3 has one completed seed only: no group
    assert group["values"] == {"algorithm.ar_alpha": "0.1"} and group["seeds"] == ["1", "2"]
    reward = group["metrics"]["reward/mean"]
    _, boot = bootstrap_diffs([np.array([1.0, 3.0])])
    assert reward["mean"] == 2.0 and reward["seeds"] == 2
    assert reward["ci95"] == pytest.approx(list(np.percentile(boot, [2.5, 97.5])))
    assert group["metrics"]["objective"]["mean"] == pytest.approx(0.2)
    assert "Seeds 1, 2 at algorithm.ar_alpha=0.1" in markdown(summarise(sweep))


def test_job_status_records_the_objective_or_the_one_line_error():
    ok = JobReturn(overrides=["seed=1"], status=JobStatus.COMPLETED)
    ok.return_value = 0.25
    assert job_status(ok) == {"status": "completed", "objective": 0.25, "overrides": ["seed=1"]}
    failed = JobReturn(overrides=["seed=2"], status=JobStatus.FAILED)
    sent_back = pickle.loads(pickle.dumps(JobFailed("ConfigError: optim.lr=1e+38 is too large", "s.md")))
    assert str(sent_back) == "ConfigError: optim.lr=1e+38 is too large (every job's result: s.md)"
    failed.return_value = sent_back
    assert job_status(failed)["error"] == "ConfigError: optim.lr=1e+38 is too large"
    crashed = JobReturn(overrides=[], status=JobStatus.FAILED)
    crashed.return_value = RuntimeError("engine died\nsecond line")
    assert job_status(crashed)["error"] == "RuntimeError: engine died"
