"""The staleness guard and the ``async/*`` tags of a step trained on samples from older weights
(``rollout.placement=server``; docs/metrics.md, docs/algorithms.md "Off-policy samples").

:func:`add_async_metrics` is called by ``GRPOModule.training_step`` once the step's ``logπ_old`` is
complete and before its first optimizer step, so a sample outside the bound stops the run with the
weights untouched. Each value is declared with the kind that makes its rank reduction exact
(:mod:`arlopti.learner.step_metrics`):

* ``async/staleness_mean`` and ``async/staleness_frac/<s>``: ``mean`` weighted by the rank's samples;
* ``async/staleness_max``: ``max``;
* ``async/low_prob_flip_frac/<b>``: ``mean`` weighted by the rank's valid tokens in bucket ``<b>``, and
  ``.../all`` by all its valid tokens; a bucket with no token on this rank adds nothing;
* the rollout workers' side (``Experience.async_stats``: the trainer's wait, the workers' idle time,
  queue depth, sync and generation time, restarts, the batch's version, each worker's tokens/s):
  ``max`` (one trainer process drives the workers).
"""

from __future__ import annotations

from torch import Tensor

from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.plugins.staleness import (PREFIX, check_staleness_bound, low_prob_flip_counts, sample_staleness,
                                          staleness_metrics)
from arlopti.learner.experience import Experience
from arlopti.learner.metric_set import MetricSet


def add_async_metrics(metrics: MetricSet, experience: Experience, old_log_probs: Tensor, trained_version: int,
                      max_staleness: int, threshold: float) -> None:
    """Check and describe this rank's samples, if they carry policy versions (else nothing).

    ``trained_version``: the policy version being trained (``rollout_step`` before the step counts
    itself). Raises :class:`~arlopti.plugins.staleness.StalenessError` for a sample with
    staleness outside ``[0, max_staleness]``. With the engine's log-probs, adds the flip fractions at
    ``threshold`` (``algorithm.low_prob_threshold``, a diagnostic whether or not Lopti is on: the share of
    tokens on the other side of the threshold under π_old than under the engine's policy)."""
    for key, value in experience.async_stats.items():
        metrics.add(f"{PREFIX}/{key}", float(value), "max")
    if experience.policy_versions is None:
        return
    staleness = sample_staleness(trained_version, experience.policy_versions)
    check_staleness_bound(staleness, max_staleness)
    n = float(staleness.numel())
    for key, value in staleness_metrics(staleness, max_staleness).items():
        kind = "max" if key == f"{PREFIX}/staleness_max" else "mean"
        metrics.add(key, value, kind, weight=n if kind == "mean" else 1.0)
    if experience.engine_logprobs is not None:
        _add_flip_fractions(metrics, experience.engine_logprobs, old_log_probs, experience.response_mask, threshold)


def _add_flip_fractions(metrics: MetricSet, behaviour: Tensor, old: Tensor, mask: Tensor, threshold: float) -> None:
    flips, tokens = low_prob_flip_counts(behaviour, old, mask, threshold)
    for b, name in enumerate(BUCKET_NAMES):
        if tokens[b] > 0:
            metrics.add(f"{PREFIX}/low_prob_flip_frac/{name}", float(flips[b] / tokens[b]), weight=float(tokens[b]))
    total = float(tokens.sum())
    if total > 0:
        metrics.add(f"{PREFIX}/low_prob_flip_frac/all", float(flips.sum()) / total, weight=total)
