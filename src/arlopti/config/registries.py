"""A tiny name → function registry (verl's pattern), so configs pick estimators by name."""

from __future__ import annotations

from typing import Callable


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def deco(fn: Callable) -> Callable:
            if name in self._fns:
                raise KeyError(f"{self.kind} {name!r} is registered twice")
            self._fns[name] = fn
            return fn

        return deco

    def get(self, name: str) -> Callable:
        if name not in self._fns:
            raise KeyError(f"unknown {self.kind} {name!r}; choose one of {sorted(self._fns)}")
        return self._fns[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    def notes(self) -> dict[str, str]:
        """name -> the first line of its function's docstring, in registration order (the config's
        ``choices`` with their notes, so that each note is written once, at the function)."""
        return {name: (fn.__doc__ or "").strip().split("\n", 1)[0] for name, fn in self._fns.items()}


ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
KL_ESTIMATORS = Registry("KL estimator")
LOSS_AGGREGATIONS = Registry("loss aggregation")
POLICY_LOSSES = Registry("policy loss")
ROLLOUT_CORRECTIONS = Registry("rollout correction")
TOKEN_METHODS = Registry("token method")
