"""The PPO-clip policy loss with asymmetric clipping and dual-clip (as in the official code).

Per token, with ratio ρ = exp(logπ_θ − logπ_old) and advantage A:

    l₁ = −A·ρ
    l₂ = −A·clip(ρ, 1 − ε_low, 1 + ε_high)
    l  = max(l₁, l₂)                         (PPO clip; clip-higher when ε_high > ε_low)
    l  = min(l, −A·c)        where A < 0      (dual-clip: caps the loss of negative-advantage
                                               tokens whose ratio exploded, c = dual_clip)

The loss is ``aggregate(l, response_mask, agg, scale)`` (see :mod:`.aggregation`); with
``token-mean`` that is Σ l·m / Σ m. Gradients: where no clip is active, ∂l/∂logπ_t = −A_t·ρ_t,
so token t's gradient is proportional to its (reweighted) advantage.

``log π − log π_old`` is clamped to [−20, 20] before the exponential, for numerical safety only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.algorithms.aggregation import aggregate


def per_token_policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                          clip_low: float = 0.2, clip_high: float = 0.24,
                          dual_clip: float | None = 10.0) -> tuple[Tensor, dict[str, Tensor]]:
    """The unreduced loss ``[B, T]`` and boolean indicator maps of which clip was active."""
    log_ratio = (log_probs - old_log_probs.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    neg = advantages < 0
    dual_active = torch.zeros_like(neg)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"algorithm.dual_clip={dual_clip} must be > 1 (or null to disable)")
        cap = -advantages * dual_clip
        dual_active = neg & (loss > cap)
        loss = torch.where(neg, torch.minimum(loss, cap), loss)
    indicators = {
        "clip_high": (advantages > 0) & (ratio > 1.0 + clip_high),
        "clip_low": neg & (ratio < 1.0 - clip_low),
        "clip_dual": dual_active,
        "ratio": ratio.detach(),
        "log_ratio": log_ratio.detach(),
    }
    return loss, indicators


def policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
                clip_low: float = 0.2, clip_high: float = 0.24, dual_clip: float | None = 10.0,
                agg: str = "token-mean", scale: float | None = None, horizon: int | None = None,
                metrics_mask: Tensor | None = None, with_token_loss: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Aggregated PPO-clip loss (module docstring) and its metrics.

    ``metrics_mask`` (default: ``response_mask``) selects the tokens the metrics describe,
    e.g. one Lopti phase's tokens while the loss is still normalised by all tokens.
    Metrics: ``clip_frac_low``, ``clip_frac_high``, ``clip_frac_dual`` (fractions of those tokens
    where each clip is active), ``approx_kl`` (mean of logπ_old − logπ, the k1 estimate of
    KL(π_old‖π_θ)), ``ratio_mean``, ``ratio_max``, ``ratio_min``, ``tokens`` (how many tokens they
    describe); with ``with_token_loss`` also ``pg_loss``, the mean per-token loss over those tokens.
    """
    loss_tok, ind = per_token_policy_loss(log_probs, old_log_probs, advantages, clip_low, clip_high, dual_clip)
    loss = aggregate(loss_tok, response_mask, agg, scale=scale, horizon=horizon)
    mm = (response_mask if metrics_mask is None else metrics_mask).bool()
    n = mm.sum().clamp(min=1)
    with torch.no_grad():
        ratio = ind["ratio"]
        metrics = {
            "clip_frac_low": float((ind["clip_low"] & mm).sum() / n),
            "clip_frac_high": float((ind["clip_high"] & mm).sum() / n),
            "clip_frac_dual": float((ind["clip_dual"] & mm).sum() / n),
            "approx_kl": float((-ind["log_ratio"] * mm).sum() / n),
            "ratio_mean": float((ratio * mm).sum() / n),
            "ratio_max": float(ratio[mm].max()) if mm.any() else 1.0,
            "ratio_min": float(ratio[mm].min()) if mm.any() else 1.0,
            "tokens": float(mm.sum()),
        }
        if with_token_loss:
            metrics["pg_loss"] = float((loss_tok * mm).sum() / n)
    return loss, metrics
