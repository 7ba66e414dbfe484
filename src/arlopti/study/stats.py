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


def bonferroni(p: float, comparisons: int) -> float:
    """The Bonferroni-adjusted p of one of ``comparisons`` tests: ``min(1, p · comparisons)``."""
    if comparisons < 1:
        raise ValueError(f"bonferroni: {comparisons} comparisons")
    return min(1.0, p * comparisons)


def adjusted_ci(values, comparisons: int, resamples: int = RESAMPLES, seed: int = SEED) -> list:
    """The percentile-bootstrap CI of the mean of ``values`` (over seeds) at the family-wise level
    ``1 − 0.05 / comparisons`` (Bonferroni): percentiles ``2.5 / m`` and ``100 − 2.5 / m``, the same draws
    as :func:`mean_ci`; ``[None, None]`` without a finite value."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return [None, None]
    per_set, _ = bootstrap_diffs([v], resamples, seed)
    tail = 2.5 / comparisons
    lo, hi = np.percentile(per_set[0], [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def window_noise_variance(rewards: list[float], window: int) -> float:
    """The sampling variance of one run's ``final`` (the mean of its last ``window`` step rewards), estimated
    within the run: the sample variance of those ``window`` values divided by ``window`` (the steps taken
    as independent draws around the run's level; a trend inside the window adds to it, so it errs high)."""
    tail = np.array(rewards[-window:], dtype=float)
    if tail.size < 2:
        raise ValueError(f"window_noise_variance: {tail.size} step(s); at least 2 needed")
    return float(tail.var(ddof=1) / tail.size)


def between_seed_variance(diffs: list[float], noise_variances: list[float]) -> dict:
    """The variance of a paired difference over seeds split into its two terms (method of moments):
    ``total`` = the sample variance of the per-seed differences ``d_s``; ``noise`` = the mean of each
    seed's own sampling variance of ``d_s`` (``noise_variances``, e.g. the two runs'
    :func:`window_noise_variance` summed); ``between`` = ``max(0, total − noise)``: how much the difference
    itself changes from seed to seed (weights, prompt order, trajectory), which more evaluations of the
    same seeds cannot shrink. ``between_share`` = between / total."""
    if len(diffs) != len(noise_variances) or len(diffs) < 2:
        raise ValueError(f"between_seed_variance: {len(diffs)} differences, {len(noise_variances)} noise terms "
                         "(the same seeds, at least 2)")
    total = float(np.var(np.array(diffs, dtype=float), ddof=1))
    noise = float(np.mean(noise_variances))
    between = max(0.0, total - noise)
    return {"total": total, "noise": noise, "between": between,
            "between_share": between / total if total > 0 else None, "seeds": len(diffs)}


def z_quantile(q: float) -> float:
    """The standard normal quantile (``statistics.NormalDist``)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def items_needed(delta: float, item_variance: float, seeds: int, seed_variance: float = 0.0,
                 alpha: float = 0.05, power: float = 0.8) -> float:
    """Items per seed (puzzles, per method) for a two-sided level-``alpha`` test of a paired difference
    ``delta`` to have ``power``, over ``seeds`` seeds. The difference's variance is
    ``seed_variance / S + item_variance / (S · n)`` (``item_variance``: one item's variance of the paired
    difference, e.g. ``2 p (1 − p)`` for two uncorrelated accuracies ``p``); solving
    ``(z_{1−α/2} + z_power)² · Var = δ²`` for n. ``inf`` when the seed term alone is too large, i.e.
    ``seeds <`` :func:`seeds_needed`."""
    k = (z_quantile(1 - alpha / 2) + z_quantile(power)) ** 2
    room = delta ** 2 / k - seed_variance / seeds
    return math.inf if room <= 0 else item_variance / (seeds * room)


def seeds_needed(delta: float, seed_variance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The fewest seeds with which ``delta`` could be resolved at all, with infinitely many items per seed:
    ``(z_{1−α/2} + z_power)² · seed_variance / δ²`` (not rounded)."""
    k = (z_quantile(1 - alpha / 2) + z_quantile(power)) ** 2
    return k * seed_variance / delta ** 2
