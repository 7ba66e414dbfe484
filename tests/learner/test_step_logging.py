"""The HPARAMS columns (arlopti/learner/step_logging.py): what tells runs apart comes first."""

from __future__ import annotations

from dataclasses import asdict

from arlopti.config import AlgorithmConfig, LoptiConfig, RunConfig
from arlopti.learner.step_logging import hparams_first


def test_runs_are_told_apart_by_the_first_columns():
    grpo = asdict(RunConfig())
    lopti = asdict(RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.4))))
    ident = {"seed": 7, "task_name": "kk_lopti"}
    first = list(hparams_first(lopti, ident).items())[:8]
    assert first == [("algorithm", "ar_lopti"), ("estimator", "grpo"), ("loss", "ppo_clip / token-mean"),
                     ("token_method", "none"), ("alpha", 0.3), ("eta", 0.4), ("seed", 7), ("task_name", "kk_lopti")]
    g = hparams_first(grpo)
    assert (g["algorithm"], g["alpha"], g["eta"]) == ("grpo", 0.0, 0.0) and "seed" not in g
    assert g["algorithm/lopti/enabled"] is False  # the full run config follows, flattened
