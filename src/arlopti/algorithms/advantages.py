"""Outcome-reward advantage estimators for group sampling (one scalar per response).

All estimators take ``rewards [N]`` and ``group_ids [N]`` (any integers; responses sharing an id
were sampled from the same prompt) and return one advantage per response, ``[N]`` float32.

* ``grpo``   A_i = (r_i − mean_g) / (std_g + eps), std_g the **unbiased** (n − 1) std of the
             group (the official code's ``torch.std``). ``eps`` is added to the std, not the
             variance. A group of one has no baseline: mean 0, std 1 (official behaviour).
* ``drgrpo`` A_i = r_i − mean_g (no std normalisation; Dr. GRPO).
* ``rloo``   A_i = r_i − mean_{j≠i in g} r_j (leave-one-out baseline); 0 for a group of one
             (no other response to compare with). **Differs from verl**, whose
             ``compute_rloo_outcome_advantage`` leaves a group of one at its score, A = r.

A group whose rewards are all equal gets A = 0 under every group-baseline estimator.

Those three take one scalar per response. The registered estimators (``ADVANTAGE_ESTIMATORS``,
chosen by ``algorithm.advantage``) all take the **token rewards** ``[B, T]`` instead, verl's
``token_level_rewards``: the outcome reward on each response's last valid token
(:func:`outcome_token_rewards`), minus ``β·KL`` on every token when ``algorithm.kl_in=reward``.
The group estimators score a response by the sum of its token rewards (so with ``kl_in=loss`` that
is the outcome reward itself) and broadcast the advantage to its tokens. The estimators beyond these
three (REINFORCE++, OTB) are options, registered by :mod:`arlopti.plugins.advantages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from arlopti.config.registries import ADVANTAGE_ESTIMATORS


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-response group size, group sum and group sum of squares (float64 for exactness)."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    r = rewards.double()
    k = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(k, dtype=torch.float64, device=r.device).scatter_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(k, dtype=torch.float64, device=r.device).scatter_add_(0, inverse, r)
    sq = torch.zeros(k, dtype=torch.float64, device=r.device).scatter_add_(0, inverse, r * r)
    return count[inverse], total[inverse], sq[inverse]


def grpo_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6, norm_by_std: bool = True) -> Tensor:
    """GRPO group-relative advantage; see the module docstring for the exact formula."""
    n, total, sq = _group_stats(rewards, group_ids)
    r = rewards.double()
    mean = torch.where(n > 1, total / n, torch.zeros_like(total))
    var = torch.where(n > 1, (sq - n * mean * mean) / (n - 1).clamp(min=1), torch.ones_like(total))
    centred = r - mean
    if not norm_by_std:
        return centred.float()
    std = var.clamp(min=0).sqrt()
    return (centred / (std + eps)).float()


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out: r_i minus the mean of the other rewards in its group."""
    n, total, _ = _group_stats(rewards, group_ids)
    r = rewards.double()
    others = torch.where(n > 1, (total - r) / (n - 1).clamp(min=1), r)
    return (r - others).float()


Reduce = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class OldPolicyStats:
    """What an estimator may read of the old (rollout-time) policy, ``[B, T]`` each, detached, at the
    rollout temperature: ``log_probs`` = logπ_old of the sampled tokens and ``sum_p2`` = Σ_v π_old(v)²
    (the fused log-prob pass's statistic, :class:`arlopti.ops.tile_stats.StatsRequest`)."""

    log_probs: Tensor
    sum_p2: Tensor | None = None


def local_sum(t: Tensor) -> Tensor:
    """The sum over the ranks of one process: ``t`` itself (``reduce``'s default)."""
    return t


def outcome_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` → ``[B, T]``: each response's reward on its last valid token (the last position where the
    mask is 1, also when the mask has holes: the environment's tokens inside a multi-turn episode), 0
    elsewhere (a response with no valid token gets none). verl's ``token_level_scores``."""
    mask = response_mask.to(torch.float32)
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=mask.dtype)
    last = (mask * positions).argmax(-1)
    out = torch.zeros_like(mask)
    out[torch.arange(mask.shape[0], device=mask.device), last] = rewards.to(mask)
    return out * mask


def sequence_scores(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
    return (token_rewards * response_mask.to(token_rewards.dtype)).sum(-1)


@ADVANTAGE_ESTIMATORS.register("grpo")
def _grpo(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
          gamma: float = 1.0, reduce: Reduce = local_sum, old: OldPolicyStats | None = None) -> Tensor:
    scores = sequence_scores(token_rewards, response_mask)
    return broadcast_to_tokens(grpo_advantages(scores, group_ids, eps=eps, norm_by_std=True), response_mask)


@ADVANTAGE_ESTIMATORS.register("drgrpo")
def _drgrpo(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
            gamma: float = 1.0, reduce: Reduce = local_sum, old: OldPolicyStats | None = None) -> Tensor:
    scores = sequence_scores(token_rewards, response_mask)
    return broadcast_to_tokens(grpo_advantages(scores, group_ids, eps=eps, norm_by_std=False), response_mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def _rloo(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
          gamma: float = 1.0, reduce: Reduce = local_sum, old: OldPolicyStats | None = None) -> Tensor:
    return broadcast_to_tokens(rloo_advantages(sequence_scores(token_rewards, response_mask), group_ids),
                               response_mask)


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """``[N]`` → ``[N, T]``: every response token carries its sequence's advantage; 0 on padding."""
    return advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)


def zero_std_group_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they give no learning signal)."""
    n, total, sq = _group_stats(rewards, group_ids)
    mean = total / n
    spread = (sq / n - mean * mean).abs() < 1e-12
    _, first = torch.unique(group_ids, return_inverse=True)
    k = int(first.max()) + 1 if first.numel() else 0
    per_group = torch.zeros(k, dtype=torch.bool, device=spread.device).scatter_(0, first, spread)
    return float(per_group.float().mean()) if k else 0.0
