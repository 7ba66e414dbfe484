"""The rollout/trainer mismatch tags (``mismatch/*``, docs/metrics.md) added to a step's :class:`MetricSet`.

:func:`add_mismatch_metrics` takes one rank's ``logπ_old`` (the learner's), the engine's sampling
log-probs (``Experience.engine_logprobs``) and the response mask, computes
:func:`arlopti.plugins.mismatch.mismatch_metrics`, and declares each value with the kind that
makes its rank reduction exact:

* ``mismatch/tokens`` and ``mismatch/tokens/<b>``: ``sum``;
* ``mismatch/abs_diff_max`` and ``.../<b>``: ``max``;
* every other value (a mean over tokens): ``mean`` weighted by the token count of the same set
  (all valid tokens, or bucket ``<b>``'s), so N ranks give the mean over all their tokens.

An empty set (a bucket with no token on this rank) adds only its count 0: its means and max
are skipped, not written as 0, so a bucket empty on every rank writes no mean that step (as
:func:`arlopti.learner.step_metrics.add_objective_metrics` skips the extremes of no token).
"""

from __future__ import annotations

from torch import Tensor

from arlopti.plugins.mismatch import PREFIX, mismatch_metrics
from arlopti.learner.metric_set import MetricSet

#: How each ``mismatch/<name>`` combines (``mean``, token-weighted, unless listed).
MISMATCH_KINDS = {"tokens": "sum", "abs_diff_max": "max"}


def _name_and_set(key: str) -> tuple[str, str]:
    """``mismatch/<name>[/<b>]`` → (``<name>``, the key of the same set's token count)."""
    parts = key.split("/")
    tokens_key = "/".join([PREFIX, "tokens", *parts[2:]])
    return parts[1], tokens_key


def add_mismatch_metrics(metrics: MetricSet, old_log_probs: Tensor, engine_log_probs: Tensor,
                         response_mask: Tensor) -> None:
    """Add this rank's ``mismatch/*`` values to ``metrics`` with their reduction kinds (module doc)."""
    values = mismatch_metrics(old_log_probs, engine_log_probs, response_mask)
    for key, value in values.items():
        name, tokens_key = _name_and_set(key)
        kind = MISMATCH_KINDS.get(name, "mean")
        if kind == "sum":
            metrics.add(key, value, "sum")
            continue
        n = values[tokens_key]
        if n == 0:
            continue  # no token in this set: nothing to average, no extreme (a NaN log-prob stays NaN)
        metrics.add(key, value, kind, weight=n if kind == "mean" else 1.0)
