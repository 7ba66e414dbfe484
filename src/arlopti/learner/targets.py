"""The per-token inputs of a rollout step's optimizer steps: :class:`Targets`, complete and immutable.

Two routes lead to them (the learner's module docstring, "Forward passes"):

- fresh: a no-grad pass gives every row's ``logπ_old``, then :func:`complete_targets`;
- reused first forward: the first optimizer step's own training forward gives ``logπ_old`` of its
  rows (:class:`FirstForward` hands that step its per-micro-batch inputs while it runs), then
  :func:`complete_targets` on the filled ``old``.

Either way AR, the phase masks and the phases skipped as empty are decided in one place,
:func:`complete_targets` (the per-token maths in :func:`~arlopti.algorithms.plan.token_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor

from arlopti.algorithms import ADVANTAGE_ESTIMATORS, Phase, kl_penalty
from arlopti.algorithms.advantages import OldPolicyStats, estimator_options, outcome_token_rewards
from arlopti.algorithms.plan import first_step_inputs, token_inputs
from arlopti.config import AlgorithmConfig
from arlopti.learner.experience import Experience
from arlopti.ops.tile_stats import TokenStats


def token_advantages(exp: Experience, old: Tensor, ref: Tensor | None, loss_mask: Tensor, a: AlgorithmConfig,
                     sum_over_ranks: Callable[[Tensor], Tensor], old_stats: TokenStats | None = None) -> Tensor:
    """Token advantages ``[B, R]`` before AR: the outcome reward on each response's last token,
    minus β·KL(logπ_old, logπ_ref) per token under ``kl_in=reward``, through the configured
    estimator (:mod:`arlopti.algorithms.advantages`; batch statistics summed over ranks by
    ``sum_over_ranks``). ``exp`` is every sampled response: under ``dapo.mask_truncated`` a truncated
    response's reward still enters its group's statistics, and only then is it zeroed by ``loss_mask``
    (TRL's ``mask_truncated_completions`` order; docs/algorithms.md). ``old`` and ``old_stats`` (the old
    pass's Σ p², :func:`arlopti.algorithms.forward_needs.old_pass_stats`) reach the estimator as
    :class:`~arlopti.algorithms.advantages.OldPolicyStats` (only OTB reads them)."""
    rewards = outcome_token_rewards(exp.rewards, exp.response_mask)
    if a.kl_in == "reward" and ref is not None:  # logπ_old is zero on masked rows: KL only where the loss is
        rewards = rewards - a.kl_coef * kl_penalty(old, ref, a.kl_estimator) * loss_mask
    old_policy = OldPolicyStats(old, None if old_stats is None else old_stats.sum_p2)
    adv = ADVANTAGE_ESTIMATORS.get(a.advantage)(rewards, exp.response_mask, exp.group_ids, eps=a.adv_eps,
                                                gamma=a.gamma, reduce=sum_over_ranks, old=old_policy,
                                                **estimator_options(a))
    return adv if loss_mask is exp.response_mask else adv * loss_mask


@dataclass(frozen=True)
class Targets:
    """What every optimizer step of a rollout step trains on, decided before the first is applied."""

    old: Tensor  # [B, R] logπ_old
    ref: Tensor | None  # [B, R] reference log-probs (β > 0)
    adv_raw: Tensor  # [B, R] advantages before AR
    adv: Tensor  # [B, R] after AR
    phases: dict[str, Phase]  # in run order
    skipped: frozenset[str]  # phases with no token on any rank, under lopti.empty_phase=skip

    def micro(self, phase: str, idx: Tensor, r: int, log_probs: Tensor, response_mask: Tensor):
        """``(old, adv, phase mask)`` of micro-batch rows ``idx`` (``r`` response columns)."""
        return self.old[idx, :r], self.adv[idx, :r], self.phases[phase].token_mask[idx, :r]


@dataclass(frozen=True)
class FirstForward:
    """The reused first optimizer step's inputs: each micro-batch's ``logπ_old``, AR and phase mask
    come from its own forward (:func:`~arlopti.algorithms.plan.first_step_inputs`), and its
    ``logπ_old`` is written into ``old`` for :func:`complete_targets`."""

    old: Tensor  # [B, R]; the first step's rows are filled as its micro-batches run
    ref: Tensor | None
    adv_raw: Tensor
    ar_alpha: float
    eta: float | None

    def micro(self, phase: str, idx: Tensor, r: int, log_probs: Tensor, response_mask: Tensor):
        old, adv, pmask = first_step_inputs(log_probs, response_mask, self.adv_raw[idx, :r], self.ar_alpha, phase,
                                            self.eta)
        self.old[idx, :r] = old
        return old, adv, pmask


def complete_targets(old: Tensor, ref: Tensor | None, adv_raw: Tensor, response_mask: Tensor, *, ar_alpha: float,
                     eta: float | None, reverse: bool, skip_empty: bool,
                     sum_over_ranks: Callable[[float], float]) -> Targets:
    """AR once, the phase masks, and (under ``skip_empty``) which phases have no token on any rank:
    ``sum_over_ranks`` is a collective, called once per phase on every rank."""
    adv, phases = token_inputs(old, response_mask, adv_raw, ar_alpha, eta, reverse)
    empty = {name for name, ph in phases.items() if sum_over_ranks(float(ph.token_mask.sum())) == 0} \
        if skip_empty else set()
    return Targets(old=old, ref=ref, adv_raw=adv_raw, adv=adv, phases=phases, skipped=frozenset(empty))
