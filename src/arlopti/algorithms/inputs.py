"""Each token's inputs to a rollout step's optimizer steps: p_old, the advantage after AR, its phase.

:func:`token_inputs` is the one place that turns ``logπ_old`` into them: AR ``(α·p_old + 1 − α)·A``
(when α > 0) and the Lopti phase masks (``p_old < η`` is ``low``). Both are per-token functions of
p_old, so a micro-batch's slice gives the whole batch's values element for element.

Two ways lead to ``logπ_old``, and both end in :func:`token_inputs`:

* the no-grad old-log-prob pass gives every row's, then :func:`step_inputs` builds the complete,
  immutable :class:`StepInputs`;
* the first optimizer step runs before any update, so its own training forward *is* ``logπ_old`` for
  its rows (:class:`FirstStepInputs` hands that step its micro-batches' inputs as it runs and records
  their ``logπ_old``); then :func:`step_inputs` completes them. Equal to the separate pass to float
  rounding (tests/learner/test_forward_reuse.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor

from arlopti.algorithms.isolation import Phase, phase_plan
from arlopti.algorithms.reweighting import advantage_reweight


def token_inputs(old: Tensor, response_mask: Tensor, advantages: Tensor, ar_alpha: float, eta: float | None,
                 reverse: bool = False) -> tuple[Tensor, dict[str, Phase]]:
    """``(advantages after AR, {phase name: Phase})`` from ``logπ_old`` (module docstring); ``eta`` is
    Lopti's η, None without Lopti (one phase, ``all``)."""
    adv = advantage_reweight(advantages, old, ar_alpha) if ar_alpha > 0 else advantages
    return adv, {ph.name: ph for ph in phase_plan(response_mask, old, eta, reverse)}


@dataclass(frozen=True)
class StepInputs:
    """What every optimizer step of a rollout step trains on, decided before the first is applied."""

    old: Tensor  # [B, R] logπ_old
    ref: Tensor | None  # [B, R] reference log-probs (β > 0)
    base_advantages: Tensor  # [B, R] the estimator's, before AR
    advantages: Tensor  # [B, R] after AR
    phases: dict[str, Phase]  # in run order
    skipped: frozenset[str]  # phases with no token on any rank, under lopti.empty_phase=skip

    def micro(self, phase: str, idx: Tensor, r: int, log_probs: Tensor, response_mask: Tensor):
        """``(old, advantages, phase mask)`` of micro-batch rows ``idx`` (``r`` response columns)."""
        return self.old[idx, :r], self.advantages[idx, :r], self.phases[phase].token_mask[idx, :r]


@dataclass(frozen=True)
class FirstStepInputs:
    """The first optimizer step's inputs when it takes ``logπ_old`` from its own forward (module docstring):
    each micro-batch's come from its log-probs through :func:`token_inputs`, and its ``logπ_old`` is
    written into ``old`` (``[B, R]``) for :func:`step_inputs`."""

    old: Tensor
    ref: Tensor | None
    base_advantages: Tensor
    ar_alpha: float
    eta: float | None

    def micro(self, phase: str, idx: Tensor, r: int, log_probs: Tensor, response_mask: Tensor):
        old = log_probs.detach() * response_mask
        adv, phases = token_inputs(old, response_mask, self.base_advantages[idx, :r], self.ar_alpha, self.eta)
        self.old[idx, :r] = old
        return old, adv, phases[phase].token_mask


def step_inputs(old: Tensor, ref: Tensor | None, base_advantages: Tensor, response_mask: Tensor, *,
                ar_alpha: float, eta: float | None, reverse: bool, skip_empty: bool,
                sum_over_ranks: Callable[[float], float]) -> StepInputs:
    """AR once, the phase masks, and (under ``skip_empty``) which phases have no token on any rank:
    ``sum_over_ranks`` is a collective, called once per phase on every rank."""
    adv, phases = token_inputs(old, response_mask, base_advantages, ar_alpha, eta, reverse)
    empty = {name for name, ph in phases.items() if sum_over_ranks(float(ph.token_mask.sum())) == 0} \
        if skip_empty else set()
    return StepInputs(old, ref, base_advantages, adv, phases, frozenset(empty))
