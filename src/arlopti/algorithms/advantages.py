"""Outcome-reward advantage estimators for group sampling (one scalar per response).

All estimators take ``rewards [N]`` and ``group_ids [N]`` (any integers; responses sharing an id
were sampled from the same prompt) and return one advantage per response, ``[N]`` float32.

* ``grpo``   A_i = (r_i − mean_g) / (std_g + eps), std_g the **unbiased** (n − 1) std of the
             group (the official code's ``torch.std``). ``eps`` is added to the std, not the
             variance. A group of one has no baseline: mean 0, std 1 (official behaviour).
* ``drgrpo`` A_i = r_i − mean_g (no std normalisation; Dr. GRPO).
* ``rloo``   A_i = r_i − mean_{j≠i in g} r_j (leave-one-out baseline); 0 for a group of one.

A group whose rewards are all equal gets A = 0 under every estimator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.algorithms.registry import ADVANTAGE_ESTIMATORS


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-response group size, group sum and group sum of squares (float64 for exactness)."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    r = rewards.double()
    k = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inverse, r)
    sq = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inverse, r * r)
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


@ADVANTAGE_ESTIMATORS.register("grpo")
def _grpo(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    return grpo_advantages(rewards, group_ids, eps=eps, norm_by_std=True)


@ADVANTAGE_ESTIMATORS.register("drgrpo")
def _drgrpo(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    return grpo_advantages(rewards, group_ids, eps=eps, norm_by_std=False)


@ADVANTAGE_ESTIMATORS.register("rloo")
def _rloo(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    return rloo_advantages(rewards, group_ids)


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
    per_group = torch.zeros(k, dtype=torch.bool).scatter_(0, first, spread)
    return float(per_group.float().mean()) if k else 0.0
