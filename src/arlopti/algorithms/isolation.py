"""Low-Probability Token Isolation (Lopti), arXiv 2505.12929 §4.2, as the official code runs it.

Tokens are split by their **rollout-time** probability p_old = exp(old_log_probs):

    low  = response_mask ∧ (p_old <  η)      (strict, as in the official code)
    high = response_mask ∧ (p_old ≥ η)

and the update is run as two phases, low first: each phase is a full pass over all
mini-batches with the advantages (and the KL term) zeroed outside that phase's tokens.
Both phases keep the rollout-time old log-probs, so phase 2's ratio and clipping measure the
drift from the rollout policy, phase 1's changes included. ``reverse=True`` runs high first
(the paper's ablation). η must lie in (0, 1): the official code overloads η ≤ 0 to mean
"reversed" or "quantile mode", which we express with explicit flags instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Phase:
    """One update pass: its name (``all``, ``low``, ``high``) and the tokens it trains on."""

    name: str
    token_mask: Tensor  # bool [B, T]


def lopti_masks(old_log_probs: Tensor, response_mask: Tensor, eta: float) -> tuple[Tensor, Tensor]:
    """Return ``(low, high)`` bool ``[B, T]`` masks; they partition the valid response tokens."""
    if not 0.0 < eta < 1.0:
        raise ValueError(f"algorithm.lopti.eta={eta} must lie in (0, 1)")
    valid = response_mask.bool()
    low = (torch.exp(old_log_probs.detach().float()) < eta) & valid
    return low, valid & ~low


def phase_plan(response_mask: Tensor, old_log_probs: Tensor | None = None, eta: float | None = None,
               reverse: bool = False) -> list[Phase]:
    """GRPO: one phase over all tokens. Lopti (``eta`` given): ``[low, high]`` (or reversed)."""
    valid = response_mask.bool()
    if eta is None:
        return [Phase("all", valid)]
    if old_log_probs is None:
        raise ValueError("Lopti needs old_log_probs to split the tokens")
    low, high = lopti_masks(old_log_probs, valid, eta)
    phases = [Phase("low", low), Phase("high", high)]
    return phases[::-1] if reverse else phases
