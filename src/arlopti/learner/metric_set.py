"""The metric set of a rollout step: each value declared with how it combines, then reduced over ranks.

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


__all__ = ["KINDS", "MetricSet"]
