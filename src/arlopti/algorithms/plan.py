"""The order of a rollout step's optimizer steps.

Pure functions; the learner (:mod:`arlopti.learner.module`) runs what they decide, on the per-token
inputs of :mod:`.inputs`.

:func:`step_order` (the official order is ``granularity="batch"``, ``dp_actor.update_policy``
called once per phase in zhyang2226/AR-Lopti's ``ray_trainer.fit``): for every epoch, each phase
in turn makes a full pass over the mini-batches::

    batch:      [(low, mb1) … (low, mbK), (high, mb1) … (high, mbK)]
    minibatch:  [(low, mb1), (high, mb1), (low, mb2), …]
"""

from __future__ import annotations

from typing import Sequence

GRANULARITIES = ("batch", "minibatch")


def phase_names(eta: float | None, reverse: bool = False) -> list[str]:
    """The phases of a rollout step in run order: ``["all"]`` (GRPO), ``["low", "high"]`` (Lopti,
    ``eta`` given) or ``["high", "low"]`` (``reverse``). Same order as
    :func:`~arlopti.algorithms.isolation.phase_plan`."""
    if eta is None:
        return ["all"]
    return ["high", "low"] if reverse else ["low", "high"]


def step_order(phases: Sequence[str], mini_batches: Sequence[Sequence[int]], epochs: int = 1,
               granularity: str = "batch") -> list[tuple[str, list[int]]]:
    """``[(phase name, mini-batch rows)]`` in the order the optimizer steps are taken.

    ``phases`` in their run order (``["all"]``, ``["low", "high"]`` or reversed); one phase
    ignores ``granularity``. ``epochs`` repeats the whole order.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"algorithm.lopti.granularity={granularity!r}: use one of {list(GRANULARITIES)}")
    if epochs < 1:
        raise ValueError(f"algorithm.ppo_epochs={epochs} must be >= 1")
    minis = [list(mb) for mb in mini_batches]
    if granularity == "batch" or len(phases) == 1:
        one = [(p, mb) for p in phases for mb in minis]
    else:
        one = [(p, mb) for mb in minis for p in phases]
    return one * epochs


def phase_pass_ends(order: Sequence[tuple[str, Sequence[int]]]) -> list[bool]:
    """For each step of ``order``: does a run of consecutive steps of one phase end there?
    (One such run is one ``update_actor`` call of the official code.)"""
    return [i + 1 == len(order) or order[i + 1][0] != order[i][0] for i in range(len(order))]
