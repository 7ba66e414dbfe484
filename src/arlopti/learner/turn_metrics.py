"""Where in a multi-turn episode the low-probability tokens sit: the ``turns/*`` tags (docs/metrics.md).

Added to a step's :class:`~arlopti.learner.metric_set.MetricSet` by
:func:`arlopti.learner.step_metrics.add_step_metrics` when the step ran an environment
(``Experience.turn_index`` is set), each with the kind that keeps its rank reduction exact.

**Per episode** (``Experience.episode_metas``, :mod:`arlopti.rollout.turns`): model turns (mean, max),
tool calls, tool errors and timeouts (sums), the share of environment tokens among the response
tokens, the episodes rolled back at the episode limit or stopped by ``rollout.max_turns``, the
episodes a re-tokenization of the conversation would change and the tokens it would change (the
lengths of their differing spans, summed; :mod:`arlopti.rollout.retokenization`), the reward by number of turns, and the seconds spent in the
environment (``timing/env_s``).

**By token segment**, over the sampled tokens only (``turn_index >= 0``: environment tokens never
enter), with ``p_old = exp(logπ_old)`` at the rollout temperature:

* ``first_turn``: the tokens of model turn 0; ``later_turns``: those of turns 1, 2, ...;
* ``after_reply``: the first :data:`HEAD_TOKENS` tokens of every later turn (the model reading an
  environment's reply); ``rest``: every other sampled token (turn 0 included).

For each segment: its token count, the low-probability share (``p_old < algorithm.low_prob_threshold``,
a diagnostic setting of its own, not Lopti's η), its share of the step's gradient mass ``Σ|A|·(1 − p_old)`` (the
advantages after AR, as the update uses them; :func:`arlopti.plugins.buckets.grad_mass`), each
probability bucket's share of the segment's own gradient mass (:data:`~arlopti.plugins.buckets.BUCKET_NAMES`),
and, with the engine's log-probs, the rollout/trainer mismatch over the segment
(:func:`arlopti.plugins.mismatch.mismatch_metrics`: mean ``|logπ_old − logπ_engine|``, the k3 KL,
the share of tokens whose ratio leaves [0.5, 2]).
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.plugins.buckets import BUCKET_NAMES, bucket_sums, grad_mass
from arlopti.plugins.mismatch import mismatch_metrics
from arlopti.learner.metric_set import MetricSet

#: "The first tokens after a reply": this many sampled tokens at the start of every later turn.
HEAD_TOKENS = 8
#: The mismatch statistics reported per segment (``mismatch/<name>`` of the mismatch metrics).
MISMATCH_NAMES = ("abs_diff_mean", "k3_kl", "ratio_outside_frac")
#: Per-episode counts (``Episode.meta``) reported as ``turns/<name>`` sums.
EPISODE_COUNTS = ("tool_calls", "env_steps", "tool_errors", "tool_timeouts", "retokenize_diff_tokens")
#: Per-episode flags reported as ``turns/<name>_frac`` (the share of the episodes).
EPISODE_FLAGS = ("episode_limit", "turn_limit", "retokenize_diff")


def segments(turn_index: Tensor) -> dict[str, Tensor]:
    """Boolean masks ``[B, R]`` of the four segments of the module docstring."""
    later = turn_index > 0
    pos = torch.zeros_like(turn_index)
    for t in range(1, int(turn_index.max()) + 1 if turn_index.numel() else 1):
        here = turn_index == t
        pos = torch.where(here, here.long().cumsum(-1), pos)  # 1-based position within turn t
    after = later & (pos <= HEAD_TOKENS)
    return {"first_turn": turn_index == 0, "later_turns": later, "after_reply": after,
            "rest": (turn_index >= 0) & ~after}


def _segment_metrics(metrics: MetricSet, name: str, mask: Tensor, p: Tensor, mass: Tensor, total_mass: float,
                     threshold: float, old: Tensor, engine: Tensor | None) -> None:
    key = f"turns/{name}"
    n = float(mask.sum())
    metrics.add(f"{key}/tokens", n, "sum")
    if n == 0:
        return  # no token: no share or mean to report (as the mismatch buckets)
    metrics.add(f"{key}/low_prob_frac", float((p[mask] < threshold).float().mean()), weight=n)
    seg_mass = float(mass[mask].sum())
    if total_mass > 0:
        metrics.add(f"{key}/grad_mass_frac", seg_mass / total_mass, weight=total_mass)
    if seg_mass > 0:
        by_bucket = bucket_sums(mass, p, mask.float())
        for b, bucket in enumerate(BUCKET_NAMES):
            metrics.add(f"{key}/grad_mass_share/{bucket}", float(by_bucket[b]) / seg_mass, weight=seg_mass)
    if engine is not None:
        values = mismatch_metrics(old, engine, mask.float())
        for m in MISMATCH_NAMES:
            metrics.add(f"{key}/mismatch_{m}", values[f"mismatch/{m}"], weight=n)


def _episode_metrics(metrics: MetricSet, experience) -> None:
    metas = experience.episode_metas
    if not metas:
        return
    b = float(len(metas))
    turns = [int(m.get("turns", 1)) for m in metas]
    metrics.add("turns/mean", sum(turns) / b, weight=b)
    metrics.add("turns/max", float(max(turns)), "max")
    for k in EPISODE_COUNTS:
        metrics.add(f"turns/{k}", float(sum(m.get(k, 0) for m in metas)), "sum")
    for k in EPISODE_FLAGS:
        metrics.add(f"turns/{k}_frac", sum(float(m.get(k, 0)) for m in metas) / b, weight=b)
    real = float(experience.response_lengths.sum())
    env = float(sum(m.get("env_tokens", 0) for m in metas))
    if real > 0:
        metrics.add("turns/env_token_frac", env / real, weight=real)
    rewards = experience.rewards.tolist()
    for n in sorted(set(turns)):
        rows = [r for r, t in zip(rewards, turns) if t == n]
        metrics.add(f"turns/reward/{n}", sum(rows) / len(rows), weight=float(len(rows)))
    metrics.add("timing/env_s", float(sum(m.get("env_s", 0.0) for m in metas)), "max")


def add_turn_metrics(metrics: MetricSet, experience, old_log_probs: Tensor, advantages: Tensor,
                     threshold: float) -> None:
    """This rank's ``turns/*`` values (module docstring) for the sampled experience ``experience``, its
    ``logπ_old`` and the advantages the update used (after AR)."""
    if experience.turn_index is None:
        return
    _episode_metrics(metrics, experience)
    idx = experience.turn_index.to(old_log_probs.device)
    sampled = idx >= 0
    p = torch.exp(old_log_probs.detach().float()).clamp(0.0, 1.0)
    mass = grad_mass(p, advantages) * sampled
    total = float(mass.sum())
    engine = experience.engine_logprobs
    for name, mask in segments(idx).items():
        _segment_metrics(metrics, name, mask, p, mass, total, threshold, old_log_probs, engine)


__all__ = ["HEAD_TOKENS", "add_turn_metrics", "segments"]
