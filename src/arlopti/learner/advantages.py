"""The token advantages of a rollout step, before AR: the configured estimator on the token rewards."""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from arlopti.algorithms import ADVANTAGE_ESTIMATORS, kl_penalty
from arlopti.algorithms.advantages import OldPolicyStats, outcome_token_rewards
from arlopti.config import AlgorithmConfig
from arlopti.learner.experience import Experience
from arlopti.ops.tile_stats import TokenStats
from arlopti.plugins.advantages import estimator_options


def token_advantages(experience: Experience, old: Tensor, ref: Tensor | None, loss_mask: Tensor, a: AlgorithmConfig,
                     sum_over_ranks: Callable[[Tensor], Tensor], old_stats: TokenStats | None = None) -> Tensor:
    """Token advantages ``[B, R]`` before AR: the outcome reward on each response's last token,
    minus β·KL(logπ_old, logπ_ref) per token under ``kl_in=reward``, through the configured
    estimator (:mod:`arlopti.algorithms.advantages`; batch statistics summed over ranks by
    ``sum_over_ranks``). ``experience`` is every sampled response: under ``dapo.mask_truncated`` a truncated
    response's reward still enters its group's statistics, and only then is it zeroed by ``loss_mask``
    (TRL's ``mask_truncated_completions`` order; docs/algorithms.md). ``old`` and ``old_stats`` (the old
    pass's Σ p², :func:`arlopti.plugins.forward_needs.old_pass_stats`) reach the estimator as
    :class:`~arlopti.algorithms.advantages.OldPolicyStats` (only OTB reads them)."""
    rewards = outcome_token_rewards(experience.rewards, experience.response_mask)
    if a.kl_in == "reward" and ref is not None:  # logπ_old is zero on masked rows: KL only where the loss is
        rewards = rewards - a.kl_coef * kl_penalty(old, ref, a.kl_estimator) * loss_mask
    old_policy = OldPolicyStats(old, None if old_stats is None else old_stats.sum_p2)
    adv = ADVANTAGE_ESTIMATORS.get(a.advantage)(rewards, experience.response_mask, experience.group_ids, eps=a.adv_eps,
                                                gamma=a.gamma, reduce=sum_over_ranks, old=old_policy,
                                                **estimator_options(a))
    return adv if loss_mask is experience.response_mask else adv * loss_mask
