"""Advantage Reweighting (AR), arXiv 2505.12929 §4.1.

    Â_t ← [α · p_old,t + (1 − α)] · A_t,      α ∈ [0, 1],   p_old,t = exp(old_log_probs_t)

``p_old`` is the **detached, rollout-time** probability of the sampled token at the rollout
temperature (not the current π_θ). The weight lies in [1 − α, 1], so it never flips the sign
of A (and so never changes which side PPO clipping acts on). α = 0 is plain GRPO. Applied once,
to the advantage tensor, before any update; padding keeps A = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ar_weights(old_log_probs: Tensor, alpha: float) -> Tensor:
    """The per-token factor α·p_old + (1 − α), ``[B, T]``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"algorithm.ar_alpha={alpha} must lie in [0, 1]")
    return alpha * torch.exp(old_log_probs.detach().float()) + (1.0 - alpha)


def advantage_reweight(advantages: Tensor, old_log_probs: Tensor, alpha: float) -> Tensor:
    """Return the AR-weighted advantages ``[B, T]`` (see module docstring)."""
    if advantages.shape != old_log_probs.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} and old_log_probs "
                         f"{tuple(old_log_probs.shape)} must have the same [B, T] shape")
    return advantages * ar_weights(old_log_probs, alpha).to(advantages.dtype)
