"""The study's statistics over seeds: bootstrap CIs, paired differences, steps to a threshold.

Everything is over **seeds** (one number per run), never over steps or tokens within a run, so a CI
says how much the result would move with other seeds of the same setting.

* :func:`mean_ci`: the mean over seeds and its 95% percentile-bootstrap CI, drawn by
  :func:`arlopti.eval.compare.bootstrap_diffs` (``RESAMPLES`` = 10,000 resamples of the seeds with
  replacement, ``numpy.random.default_rng(SEED)``, SEED = 0; the 2.5th and 97.5th percentiles):
  the same procedure ``eval.compare`` applies to items;
* :func:`paired` (method − GRPO by seed, the seeds are the pairs): the mean difference with its
  bootstrap CI, the wins / losses / ties, and the exact two-sided **sign test** p over the seeds that
  differ, which is McNemar's exact test on (losses, wins) (:func:`arlopti.eval.compare.mcnemar_exact`);
* :func:`steps_to_threshold`: the first rollout step at which the mean reward of the last
  ``window`` steps reaches the threshold (steps count from 1); a run that never reaches it is
  **censored** at ``steps + 1``, so a mean including censored runs is a lower bound and the tables
  say how many runs reached it.
"""

from __future__ import annotations

import math

import numpy as np

from arlopti.eval.compare import RESAMPLES, SEED, bootstrap_diffs, mcnemar_exact


def mean_ci(values, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """``{"mean", "ci95": [lo, hi], "n"}`` over the finite ``values`` (module docstring); None
    entries (a bucket without tokens in that run) are left out, all-None gives mean None."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    per_set, _ = bootstrap_diffs([v], resamples, seed)
    lo, hi = np.percentile(per_set[0], [2.5, 97.5])
    return {"mean": float(v.mean()), "ci95": [float(lo), float(hi)], "n": int(v.size)}


def paired(method: list, base: list, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Method − base by seed (aligned lists): :func:`mean_ci` of the differences, wins (method
    higher), losses, ties and the exact sign-test p (module docstring). A seed where either value
    is None (a bucket without tokens in that run) is left out; ``n`` counts the pairs used."""
    if len(method) != len(base):
        raise ValueError(f"paired: {len(method)} method values but {len(base)} baseline values (same seeds needed)")
    d = [m - b for m, b in zip(method, base) if m is not None and b is not None]
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return {**mean_ci(d, resamples, seed), "wins": int(wins), "losses": int(losses),
            "ties": int(len(d) - wins - losses), "sign_test_p": mcnemar_exact(int(losses), int(wins))}


def steps_to_threshold(rewards: list[float], threshold: float, window: int = 3) -> tuple[int, bool]:
    """``(step, reached)``: the first step (1-based) whose trailing ``window``-step mean reward is
    >= ``threshold``; ``(len(rewards) + 1, False)`` when none is (censored)."""
    if window < 1:
        raise ValueError(f"--threshold-window must be >= 1, got {window}")
    for t in range(window, len(rewards) + 1):
        if sum(rewards[t - window:t]) / window >= threshold:
            return t, True
    return len(rewards) + 1, False


def curve_bands(curves: list[list[float]], resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Per step, the mean over runs and its bootstrap CI: ``{"mean": [...], "lo": [...], "hi": [...]}``."""
    arr = np.array(curves, dtype=float)  # [runs, steps]
    mean, lo, hi = [], [], []
    for t in range(arr.shape[1]):
        r = mean_ci(arr[:, t].tolist(), resamples, seed)
        mean.append(r["mean"])
        lo.append(r["ci95"][0])
        hi.append(r["ci95"][1])
    return {"mean": mean, "lo": lo, "hi": hi}
