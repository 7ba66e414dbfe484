"""logger=csv writes one metrics.csv row per rollout step (arlopti/loggers/step_csv.py)."""

from __future__ import annotations

import csv

from arlopti.loggers.step_csv import StepCSVLogger


def test_calls_of_one_step_make_one_row(tmp_path):
    logger = StepCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    logger.log_metrics({"val/kk/mean/greedy/acc": 0.1}, step=0)  # validation before training
    for step in (1, 2):
        logger.log_metrics({"reward/mean": -1.0 * step, "update/kl": 0.01}, step=step)  # the learner
        logger.log_metrics({"diag/frac": 0.5}, step=step)  # diagnostics
    logger.log_metrics({"val/kk/mean/greedy/acc": 0.3}, step=2)  # validation at the end
    logger.finalize("success")
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    assert [r["step"] for r in rows] == ["0", "1", "2"]
    assert rows[2]["reward/mean"] == "-2.0" and rows[2]["diag/frac"] == "0.5" and rows[2]["val/kk/mean/greedy/acc"] == "0.3"
    assert rows[0]["reward/mean"] == "" and rows[0]["val/kk/mean/greedy/acc"] == "0.1"
