"""The order of a rollout step's optimizer steps, and the per-token inputs of its first step.

Pure functions; the learner (:mod:`arlopti.learner.module`) runs what they decide.

:func:`step_order` (the official order is ``granularity="batch"``, ``dp_actor.update_policy``
called once per phase in zhyang2226/AR-Lopti's ``ray_trainer.fit``): for every epoch, each phase
in turn makes a full pass over the mini-batches::

    batch:      [(low, mb1) … (low, mbK), (high, mb1) … (high, mbK)]
    minibatch:  [(low, mb1), (high, mb1), (low, mb2), …]

:func:`first_step_inputs`: before the first optimizer step the policy *is* the rollout policy,
so that step's own training forward gives ``logπ_old`` of its rows; AR and the Lopti split are
per-token functions of ``p_old`` and are evaluated from it micro-batch by micro-batch, element
for element what the separate no-grad pass would give.
"""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from arlopti.algorithms.isolation import Phase, phase_plan
from arlopti.algorithms.reweighting import advantage_reweight

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


def token_inputs(old: Tensor, response_mask: Tensor, advantages: Tensor, ar_alpha: float, eta: float | None,
                 reverse: bool = False) -> tuple[Tensor, dict[str, Phase]]:
    """``(advantages after AR, {phase name: Phase})`` from ``logπ_old``: the one place that decides
    AR ``(α·p_old + 1 − α)·A`` (when α > 0) and the phase masks
    (:func:`~arlopti.algorithms.isolation.phase_plan`; ``p_old < η`` is ``low``). Both are per-token
    functions of ``p_old``, so a micro-batch's slice gives the whole batch's values element for element."""
    adv = advantage_reweight(advantages, old, ar_alpha) if ar_alpha > 0 else advantages
    return adv, {ph.name: ph for ph in phase_plan(response_mask, old, eta, reverse)}


def first_step_inputs(log_probs: Tensor, response_mask: Tensor, advantages: Tensor, ar_alpha: float,
                      phase: str, eta: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(old [b, r], advantages after AR [b, r], phase mask [b, r])`` of one micro-batch, from the
    log-probs of its own training forward taken before any update (module docstring):
    ``old = detach(log_probs) · mask``, then :func:`token_inputs`.
    """
    old = log_probs.detach() * response_mask
    adv, phases = token_inputs(old, response_mask, advantages, ar_alpha, eta)
    return old, adv, phases[phase].token_mask
