"""K&K metrics as torchmetrics, so they reduce correctly under DDP (every state is a sum).

All of them are updated with the rewards of :func:`arlopti.tasks.kk.score_response`, whose only
values are 3 (correct), -0.5 (well-formed, wrong), -1 (well-formed, unparseable) and -3 (bad
format). Hence: correct <=> reward == 3, and the format check passed <=> reward > -3 (AR-Lopti
logs the same ratios).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torchmetrics import Metric

from arlopti.tasks.kk.reward import ANSWER_UNPARSEABLE, CORRECT_TOTAL, FORMAT_REWARD

BAD_FORMAT_TOTAL = -FORMAT_REWARD + ANSWER_UNPARSEABLE  # -3
REWARD_VALUES = (3.0, -0.5, -1.0, -3.0)
MAX_PEOPLE = 16


def _as_tensor(values, dtype=torch.float64) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", dtype).reshape(-1)
    return torch.as_tensor(list(values), dtype=dtype).reshape(-1)


class KKAccuracyPerN(Metric):
    """Accuracy (reward == 3) per number of people. ``compute()`` -> ``{N: accuracy}`` for every
    N seen at least once (on any rank)."""

    full_state_update = False

    def __init__(self, max_people: int = MAX_PEOPLE, **kwargs):
        super().__init__(**kwargs)
        self.max_people = max_people
        self.add_state("correct", default=torch.zeros(max_people + 1, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros(max_people + 1, dtype=torch.float64),
                       dist_reduce_fx="sum")

    def update(self, rewards: Sequence[float] | torch.Tensor, n_people: Sequence[int] | torch.Tensor) -> None:
        r, n = _as_tensor(rewards), _as_tensor(n_people, torch.long)
        if r.shape != n.shape:
            raise ValueError(f"KKAccuracyPerN: {r.numel()} rewards but {n.numel()} n_people")
        if n.numel() and (n.min() < 0 or n.max() > self.max_people):
            raise ValueError(f"KKAccuracyPerN: n_people must lie in 0..{self.max_people}, got {n.tolist()}")
        n = n.to(self.total.device)
        self.total.index_add_(0, n, torch.ones_like(r, device=self.total.device))
        self.correct.index_add_(0, n, (r == CORRECT_TOTAL).to(self.correct.dtype).to(self.correct.device))

    def compute(self) -> dict[int, float]:
        return {int(k): float(self.correct[k] / self.total[k])
                for k in torch.nonzero(self.total > 0).flatten().tolist()}


class _RatioMetric(Metric):
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("hits", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def _hit(self, r: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, rewards: Sequence[float] | torch.Tensor) -> None:
        r = _as_tensor(rewards)
        self.hits += self._hit(r).sum().to(self.hits.device)
        self.count += r.numel()

    def compute(self) -> torch.Tensor:
        # NaN (not 0) for an empty metric, so "no data" never reads as "all wrong".
        return (self.hits / self.count).float() if self.count > 0 else torch.tensor(float("nan"))


class FormatRate(_RatioMetric):
    """Fraction of responses that pass the format check (reward > -3)."""

    def _hit(self, r):
        return (r > BAD_FORMAT_TOTAL).to(torch.float64)


class MeanReward(_RatioMetric):
    """Mean reward."""

    def _hit(self, r):
        return r


class KKMetrics(Metric):
    """Everything logged for a K&K set, from one ``update(rewards, n_people)``.

    ``compute()`` -> ``{"accuracy", "format_rate", "mean_reward", "ratio_3", "ratio_-0.5",
    "ratio_-1", "ratio_-3", "accuracy_{N}ppl" ...}`` as floats (NaN when empty).
    """

    full_state_update = False

    def __init__(self, max_people: int = MAX_PEOPLE, **kwargs):
        super().__init__(**kwargs)
        self.max_people = max_people
        self.add_state("per_n_correct", default=torch.zeros(max_people + 1, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("per_n_total", default=torch.zeros(max_people + 1, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("value_counts", default=torch.zeros(len(REWARD_VALUES), dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("format_ok", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("reward_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, rewards: Sequence[float] | torch.Tensor, n_people: Sequence[int] | torch.Tensor) -> None:
        r, n = _as_tensor(rewards), _as_tensor(n_people, torch.long)
        if r.shape != n.shape:
            raise ValueError(f"KKMetrics: {r.numel()} rewards but {n.numel()} n_people")
        if n.numel() and (n.min() < 0 or n.max() > self.max_people):
            raise ValueError(f"KKMetrics: n_people must lie in 0..{self.max_people}, got {n.tolist()}")
        dev = self.count.device
        r, n = r.to(dev), n.to(dev)
        self.per_n_total.index_add_(0, n, torch.ones_like(r))
        self.per_n_correct.index_add_(0, n, (r == CORRECT_TOTAL).to(torch.float64))
        values = torch.tensor(REWARD_VALUES, dtype=torch.float64, device=dev)
        self.value_counts += (r[:, None] == values[None, :]).sum(0).to(torch.float64)
        self.format_ok += (r > BAD_FORMAT_TOTAL).sum().to(torch.float64)
        self.reward_sum += r.sum()
        self.count += r.numel()

    def compute(self) -> dict[str, float]:
        count = float(self.count)
        nan = float("nan")
        out = {
            "accuracy": float(self.per_n_correct.sum()) / count if count else nan,
            "format_rate": float(self.format_ok) / count if count else nan,
            "mean_reward": float(self.reward_sum) / count if count else nan,
        }
        for value, hits in zip(REWARD_VALUES, self.value_counts.tolist()):
            out[f"ratio_{value:g}"] = hits / count if count else nan
        for k in torch.nonzero(self.per_n_total > 0).flatten().tolist():
            out[f"accuracy_{k}ppl"] = float(self.per_n_correct[k] / self.per_n_total[k])
        return out
