"""The learner's step metrics, each added to the step's :class:`~arlopti.learner.metric_set.MetricSet`
with the kind that makes its reduction over phases, micro-batches and ranks exact: the objective's
per-micro-batch values, the rollout's, the padding's, (:mod:`arlopti.learner.mismatch_metrics`)
the rollout/trainer mismatch, and for a multi-turn step (:mod:`arlopti.learner.turn_metrics`) the
``turns/*`` tags.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from arlopti.learner.metric_set import MetricSet
from arlopti.learner.mismatch_metrics import add_mismatch_metrics
from arlopti.learner.turn_metrics import add_turn_metrics

#: How each per-micro-batch metric of :func:`arlopti.algorithms.grpo_objective` combines.
OBJECTIVE_KINDS = {"ratio_max": "max", "ratio_min": "min", "tokens": "sum"}


def add_objective_metrics(metrics: MetricSet, prefixes: list[str], values: Mapping[str, float]) -> None:
    """One micro-batch's objective metrics under every prefix (``update`` and, where phases exist,
    ``update/<phase>``): token means weighted by the micro-batch's phase tokens."""
    tokens = float(values.get("tokens", 0.0))
    for prefix in prefixes:
        for key, value in values.items():
            if key.startswith("effective_weight"):
                _add_effective_weight(metrics, prefix, key, value, values)
                continue
            kind = OBJECTIVE_KINDS.get(key, "mean")
            if kind in ("max", "min") and tokens == 0:
                continue  # no token: no extreme to report
            metrics.add(f"{prefix}/{key}", value, kind, weight=tokens if kind == "mean" else 1.0)


def _add_effective_weight(metrics: MetricSet, prefix: str, key: str, value: float, values: Mapping[str, float]) -> None:
    """``effective_weight/<b>``: a mean weighted by its bucket's token count (the count itself is
    not a tag); :func:`arlopti.plugins.shaping.effective_weights`."""
    if key.startswith("effective_weight_tokens/"):
        return
    n = float(values.get("effective_weight_tokens/" + key.split("/", 1)[1], 0.0))
    if n > 0:
        metrics.add(f"{prefix}/{key}", value, "mean", weight=n)


#: How DAPO dynamic sampling's per-rank counts (``Experience.sampling_stats``) combine over ranks;
#: ``kept_frac`` is a mean weighted by the rank's ``groups_generated`` (so: kept / generated overall).
SAMPLING_KINDS = {"gen_rounds": "max", "groups_generated": "sum", "kept_frac": "mean", "groups_trained": "sum",
                  "no_signal_fallback": "max"}


def rollout_metrics(metrics: MetricSet, experience, old_log_probs, phases, ar_alpha: float) -> None:
    """Reward, length and token statistics of one rank's rollout (docs/metrics.md)."""
    from arlopti.algorithms import ar_weights, zero_std_group_fraction

    mask = experience.response_mask.bool()
    lengths = experience.response_mask.sum(-1)
    n_tok = float(mask.sum())
    metrics.add("reward/mean", float(experience.rewards.mean()))
    metrics.add("reward/std", float(experience.rewards.std()) if len(experience) > 1 else 0.0)
    metrics.add("reward/accuracy", float(experience.correct.float().mean()))
    metrics.add("reward/zero_std_group_frac", zero_std_group_fraction(experience.rewards, experience.group_ids))
    for k, v in experience.components.items():
        metrics.add(f"reward/{k}", float(v.float().mean()))
    metrics.add("rollout/response_len_mean", float(lengths.mean()))
    metrics.add("rollout/response_len_max", float(lengths.max()), "max")
    metrics.add("rollout/truncated_frac", float(experience.truncated.float().mean()))
    metrics.add("rollout/responses", float(len(experience)), "sum")
    metrics.add("rollout/tokens", n_tok, "sum")
    p = torch.exp(old_log_probs)[mask]
    metrics.add("rollout/token_prob_mean", float(p.mean()) if p.numel() else 0.0, weight=n_tok)
    stats = getattr(experience, "sampling_stats", None) or {}
    for k, v in stats.items():
        weight = stats.get("groups_generated", 1.0) if k == "kept_frac" else 1.0
        metrics.add(f"dapo/{k}", v, SAMPLING_KINDS[k], weight=weight)
    if ar_alpha > 0:
        w = ar_weights(old_log_probs, ar_alpha)[mask]
        metrics.add("ar/weight_mean", float(w.mean()) if w.numel() else 0.0, weight=n_tok)
    for ph in phases:
        if ph.name != "all":
            k = float(ph.token_mask.sum())
            metrics.add(f"lopti/{ph.name}_tokens", k, "sum")
            metrics.add(f"lopti/{ph.name}_frac", k / n_tok if n_tok else 0.0, weight=n_tok)


def padding_metrics(metrics: MetricSet, experience, micro_plan: Mapping[tuple, list[list[int]]]) -> None:
    """``update/valid_token_frac``: real (attention-mask) tokens / padded tokens the training
    forwards compute, over one pass of this rank's micro-batches; ``update/micro_batches``:
    micro-batches per optimizer step (mean over mini-batches)."""
    from arlopti.learner.microbatch import micro_batch_cost

    valid = padded = 0
    for mbs in micro_plan.values():
        for mb in mbs:
            lengths = [int(x) for x in experience.response_lengths[mb].tolist()]
            cost = micro_batch_cost(lengths, experience.prompt_len)
            padded += cost
            valid += int(experience.attention_mask[mb, :cost // len(mb)].sum())
    metrics.add("update/valid_token_frac", valid / max(1, padded), weight=padded)
    metrics.add("update/micro_batches", sum(len(v) for v in micro_plan.values()) / max(1, len(micro_plan)))


def add_step_metrics(metrics: MetricSet, experience, inputs, micro_plan: Mapping[tuple, list[list[int]]],
                     timings: Mapping[str, float], *, reused: int, ar_alpha: float, lr: float, nonfinite_skips: int,
                     optimizer_steps: int, low_prob_threshold: float) -> None:
    """A rollout step's metrics beyond the objective's (docs/metrics.md): phases skipped as empty
    (``inputs``: :class:`~arlopti.algorithms.inputs.StepInputs`), the rollout's statistics, the
    engine/trainer mismatch (``rollout.return_logprobs``), padding, the share of logπ_old taken
    from the first step's forward (``reused`` rows), timings and the optimizer's counters;
    ``low_prob_threshold``: ``algorithm.low_prob_threshold``, the turn metrics' low-probability p_old."""

    if len(inputs.phases) > 1:
        for name in inputs.phases:
            metrics.add(f"update/{name}/skipped_empty", float(name in inputs.skipped), "max")
    rollout_metrics(metrics, experience, inputs.old, list(inputs.phases.values()), ar_alpha)
    if experience.engine_logprobs is not None:
        add_mismatch_metrics(metrics, inputs.old, experience.engine_logprobs, experience.response_mask)
    add_turn_metrics(metrics, experience, inputs.old, inputs.advantages, low_prob_threshold)  # multi-turn only
    padding_metrics(metrics, experience, micro_plan)
    metrics.add("update/old_logprobs_reused_frac", reused / max(1, len(experience)))
    for k, v in timings.items():
        metrics.add(f"timing/{k}", v, "max")
    total_t = sum(timings.values())
    metrics.add("timing/tokens_per_s", float(experience.response_mask.sum()) / total_t if total_t > 0 else 0.0, "sum")
    metrics.add("update/lr", lr)
    metrics.add("update/nonfinite_skips", float(nonfinite_skips), "max")
    metrics.add("update/optimizer_steps", float(optimizer_steps), "max")
