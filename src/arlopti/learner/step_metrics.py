"""A rollout step's metrics: each declared with how it combines, then reduced over ranks.

Every value is added with its kind, where it is produced:

* ``mean`` (default): a weighted mean, ``Σ w·v / Σ w`` (``weight`` = 1 unless given: the learner
  weighs per-micro-batch token means by their token counts, so phases and micro-batches combine
  token-weighted, and ranks too);
* ``sum``: counts and throughput;
* ``max`` / ``min``: extremes and wall times.

Adding the same key twice combines the two by its kind (that is how the per-phase values become
the step's one tag). :meth:`MetricSet.reduce_over_ranks` applies the same rules across ranks,
so a metric means the same on 1 rank and on N. Ranks may report different keys (reward
components of different tasks): the union is reduced, each over the ranks that report it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

KINDS = ("mean", "sum", "max", "min")


class MetricSet:
    def __init__(self):
        self._kind: dict[str, str] = {}
        self._num: dict[str, float] = {}
        self._den: dict[str, float] = {}

    def add(self, key: str, value: float, kind: str = "mean", weight: float = 1.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"metric {key!r}: kind {kind!r} is not one of {KINDS}")
        if self._kind.setdefault(key, kind) != kind:
            raise ValueError(f"metric {key!r} was declared {self._kind[key]!r}, then added as {kind!r}")
        value = float(value)
        if key not in self._num:
            self._num[key], self._den[key] = (value * weight, weight) if kind == "mean" else (value, 1.0)
        elif kind == "mean":
            self._num[key] += value * weight
            self._den[key] += weight
        elif kind == "sum":
            self._num[key] += value
        else:
            self._num[key] = (max if kind == "max" else min)(self._num[key], value)

    def update(self, values: Mapping[str, float], kind: str = "mean") -> None:
        for key, value in values.items():
            self.add(key, value, kind)

    def as_dict(self) -> dict[str, float]:
        return {k: self._value(k, self._num[k], self._den[k]) for k in sorted(self._num)}

    def _value(self, key: str, num: float, den: float) -> float:
        if self._kind[key] != "mean":
            return num
        return num / den if den > 0 else 0.0

    def reduce_over_ranks(self, reduce: Callable[[torch.Tensor, str], torch.Tensor], world_size: int,
                          device) -> dict[str, float]:
        """The same combination over ranks (collective). ``reduce(tensor, op)`` is an all-reduce
        (``sum`` / ``max`` / ``min``); the keys are all-gathered first."""
        import torch.distributed as dist

        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, sorted(self._kind.items()))
        keys = sorted({k for ks in gathered for k in ks})
        kinds = dict(keys)
        names = sorted(kinds)
        present = [k in self._num for k in names]

        def vec(fill, pick):
            return torch.tensor([pick(k) if p else fill for k, p in zip(names, present)], dtype=torch.float64,
                                device=device)

        num = reduce(vec(0.0, lambda k: self._num[k] if kinds[k] in ("mean", "sum") else 0.0), "sum").tolist()
        den = reduce(vec(0.0, lambda k: self._den[k] if kinds[k] == "mean" else 0.0), "sum").tolist()
        hi = reduce(vec(-math.inf, lambda k: self._num[k] if kinds[k] == "max" else -math.inf), "max").tolist()
        lo = reduce(vec(math.inf, lambda k: self._num[k] if kinds[k] == "min" else math.inf), "min").tolist()
        out = {}
        for i, k in enumerate(names):
            kind = kinds[k]
            out[k] = hi[i] if kind == "max" else lo[i] if kind == "min" else num[i] if kind == "sum" else (
                num[i] / den[i] if den[i] > 0 else 0.0)
        return out


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
    not a tag); :func:`arlopti.algorithms.objective.effective_weights`."""
    if key.startswith("effective_weight_tokens/"):
        return
    n = float(values.get("effective_weight_tokens/" + key.split("/", 1)[1], 0.0))
    if n > 0:
        metrics.add(f"{prefix}/{key}", value, "mean", weight=n)


#: How DAPO dynamic sampling's per-rank counts (``Experience.sampling_stats``) combine over ranks;
#: ``kept_frac`` is a mean weighted by the rank's ``groups_generated`` (so: kept / generated overall).
SAMPLING_KINDS = {"gen_rounds": "max", "groups_generated": "sum", "kept_frac": "mean", "groups_trained": "sum",
                  "no_signal_fallback": "max"}


def rollout_metrics(metrics: MetricSet, exp, old_log_probs, phases, ar_alpha: float) -> None:
    """Reward, length and token statistics of one rank's rollout (docs/metrics.md)."""
    from arlopti.algorithms import ar_weights, zero_std_group_fraction

    mask = exp.response_mask.bool()
    lengths = exp.response_mask.sum(-1)
    n_tok = float(mask.sum())
    metrics.add("reward/mean", float(exp.rewards.mean()))
    metrics.add("reward/std", float(exp.rewards.std()) if len(exp) > 1 else 0.0)
    metrics.add("reward/accuracy", float(exp.correct.float().mean()))
    metrics.add("reward/zero_std_group_frac", zero_std_group_fraction(exp.rewards, exp.group_ids))
    for k, v in exp.components.items():
        metrics.add(f"reward/{k}", float(v.float().mean()))
    metrics.add("rollout/response_len_mean", float(lengths.mean()))
    metrics.add("rollout/response_len_max", float(lengths.max()), "max")
    metrics.add("rollout/truncated_frac", float(exp.truncated.float().mean()))
    metrics.add("rollout/responses", float(len(exp)), "sum")
    metrics.add("rollout/tokens", n_tok, "sum")
    p = torch.exp(old_log_probs)[mask]
    metrics.add("rollout/token_prob_mean", float(p.mean()) if p.numel() else 0.0, weight=n_tok)
    stats = getattr(exp, "sampling_stats", None) or {}
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


def padding_metrics(metrics: MetricSet, exp, micro_plan: Mapping[tuple, list[list[int]]]) -> None:
    """``update/valid_token_frac``: real (attention-mask) tokens / padded tokens the training
    forwards compute, over one pass of this rank's micro-batches; ``update/micro_batches``:
    micro-batches per optimizer step (mean over mini-batches)."""
    from arlopti.learner.microbatch import micro_batch_cost

    valid = padded = 0
    for mbs in micro_plan.values():
        for mb in mbs:
            lengths = [int(x) for x in exp.response_mask[mb].sum(-1).tolist()]
            cost = micro_batch_cost(lengths, exp.prompt_len)
            padded += cost
            valid += int(exp.attention_mask[mb, :cost // len(mb)].sum())
    metrics.add("update/valid_token_frac", valid / max(1, padded), weight=padded)
    metrics.add("update/micro_batches", sum(len(v) for v in micro_plan.values()) / max(1, len(micro_plan)))


def add_step_metrics(metrics: MetricSet, exp, targets, micro_plan: Mapping[tuple, list[list[int]]],
                     timings: Mapping[str, float], *, reused: int, ar_alpha: float, lr: float, nonfinite_skips: int,
                     optimizer_steps: int) -> None:
    """A rollout step's metrics beyond the objective's (docs/metrics.md): phases skipped as empty
    (``targets``: :class:`~arlopti.learner.targets.Targets`), the rollout's statistics, the
    engine/trainer mismatch (``rollout.return_logprobs``), padding, the share of logπ_old taken
    from the first step's forward (``reused`` rows), timings and the optimizer's counters."""
    from arlopti.learner.mismatch_metrics import add_mismatch_metrics  # it imports this module

    if len(targets.phases) > 1:
        for name in targets.phases:
            metrics.add(f"update/{name}/skipped_empty", float(name in targets.skipped), "max")
    rollout_metrics(metrics, exp, targets.old, list(targets.phases.values()), ar_alpha)
    if exp.engine_logprobs is not None:
        add_mismatch_metrics(metrics, targets.old, exp.engine_logprobs, exp.response_mask)
    padding_metrics(metrics, exp, micro_plan)
    metrics.add("update/old_logprobs_reused_frac", reused / max(1, len(exp)))
    for k, v in timings.items():
        metrics.add(f"timing/{k}", v, "max")
    total_t = sum(timings.values())
    metrics.add("timing/tokens_per_s", float(exp.response_mask.sum()) / total_t if total_t > 0 else 0.0, "sum")
    metrics.add("update/lr", lr)
    metrics.add("update/nonfinite_skips", float(nonfinite_skips), "max")
    metrics.add("update/optimizer_steps", float(optimizer_steps), "max")
