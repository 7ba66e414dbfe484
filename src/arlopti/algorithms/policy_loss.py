"""Policy losses, chosen by ``algorithm.policy_loss`` (registry ``POLICY_LOSSES``).

Every loss maps ``(logπ_θ, logπ_old, A, response_mask, ε_low, ε_high, dual_clip)`` to an
unreduced per-token loss ``[B, T]``, reduced afterwards by :mod:`.aggregation`. With
ρ_t = exp(logπ_θ,t − logπ_old,t), the log-ratio clamped to [−20, 20] against overflow (as verl's
``compute_policy_loss_vanilla``; where |logπ_θ − logπ_old| > 20 the token gets no gradient through ρ;
docs/algorithms.md, "the ratio's log is clamped", says what that changes under ``gspo``).

``ppo_clip`` (the official code's loss, the default)::

    l₁ = −A·ρ,  l₂ = −A·clip(ρ, 1 − ε_low, 1 + ε_high),  l = max(l₁, l₂)   (clip-higher: ε_high > ε_low)
    l  = min(l, −A·c)   where A < 0                                         (dual-clip, c = dual_clip)

  Where no clip is active ∂l/∂logπ_t = −A_t·ρ_t.

``gspo`` (Zheng et al. 2025, arXiv 2507.18071, GSPO-token, eq. 13-14; confirmed against verl's
``compute_policy_loss_gspo`` in ``verl/trainer/ppo/core_algos.py``)::

    log s_i = (1/|y_i|) Σ_t m_t·(logπ_θ,t − logπ_old,t)          (geometric-mean sequence ratio)
    s_i,t   = exp(sg[log s_i] + logπ_θ,t − sg[logπ_θ,t])          (value s_i; gradient through token t only)
    l       = max(−A_t·s_i,t, −A_t·clip(s_i,t, 1 − ε_low, 1 + ε_high))

  log s_i,t is clamped above at 10 as in verl. With one advantage per response and
  ``seq-mean-token-mean`` aggregation this is GSPO's sequence objective exactly; token advantages
  (AR, Lopti's phase mask) still act per token, which is why the token form is used. GSPO's
  published clip is ε_low = 3e-4, ε_high = 4e-4 (``algorithm=gspo``). No dual-clip.

``cispo`` (MiniMax-M1, arXiv 2506.13585, eq. 4-5; confirmed against verl's and NeMo-RL's
``compute_policy_loss_cispo``)::

    l = −sg[clip(ρ_t, 1 − ε_low, 1 + ε_high)] · A_t · logπ_θ,t

  The clipped importance weight is a constant, so every token keeps a gradient −A_t·ŵ_t (PPO's
  clipped tokens get none). MiniMax-M1 sets no lower bound (ε_low = 1 here, ``algorithm=cispo``).
  No dual-clip.

AR multiplies A_t by (α·p_old + 1 − α) before the loss; Lopti's phase zeroes A_t outside the phase's
tokens, and every loss's gradient at token t is proportional to A_t (GSPO's sequence ratio is a
stop-gradient constant), so the other phase's tokens get exactly zero gradient. Other methods register
further losses with the same signature (:mod:`arlopti.plugins`); ``extras`` is what such a loss reads
beyond the ratio, opaque here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from arlopti.algorithms.aggregation import Aggregation
from arlopti.config.registries import POLICY_LOSSES
from arlopti.config import AlgorithmConfig
from arlopti.config import rules as config_rules
from arlopti.config.check import check_setting


#: The losses of this module; the others are registered above the core and read a shaping's ``extras``.
CORE_LOSSES = ("ppo_clip", "gspo", "cispo")


@dataclass(frozen=True)
class Clip:
    """PPO's bounds: ratio ∈ [1 − ``low``, 1 + ``high``] (floats, or per-token ``[B, T]`` tensors) and the
    dual-clip ``dual`` (None: off); ``algorithm.clip_low``, ``clip_high`` and ``dual_clip``."""

    low: float | Tensor
    high: float | Tensor
    dual: float | None = None


def token_log_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    """logπ_θ − sg[logπ_old], clamped to [−20, 20] (module docstring)."""
    return (log_probs - old_log_probs.detach()).clamp(-20.0, 20.0)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
                  clip_low: float | Tensor, clip_high: float | Tensor,
                  dual_clip: float | None, *, extras: Any = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with clip-higher and dual-clip (module docstring). Returns the loss ``[B, T]`` and
    boolean maps of which clip was active, the ratio and the log-ratio."""
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    neg = advantages < 0
    dual_active = torch.zeros_like(neg)
    if dual_clip is not None:
        check_setting(AlgorithmConfig, "dual_clip", dual_clip, "algorithm")  # the schema's range: > 1
        bound = -advantages * dual_clip
        dual_active = neg & (loss > bound)
        loss = torch.where(neg, torch.minimum(loss, bound), loss)
    return loss, indicators(advantages, ratio, log_ratio, clip_low, clip_high, dual_active)


@POLICY_LOSSES.register("gspo")
def gspo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
              clip_low: float | Tensor, clip_high: float | Tensor,
              dual_clip: float | None, *, extras: Any = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token (module docstring). ``ratio`` in the indicators is the sequence ratio s_i."""
    no_dual_clip("gspo", dual_clip)
    mask = response_mask.to(log_probs.dtype)
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = (log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    s = torch.exp(log_s)
    loss = torch.maximum(-advantages * s, -advantages * torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high))
    seq = s.detach()
    return loss, indicators(advantages, seq, log_ratio, clip_low, clip_high, torch.zeros_like(advantages < 0))


@POLICY_LOSSES.register("cispo")
def cispo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
               clip_low: float | Tensor, clip_high: float | Tensor,
               dual_clip: float | None, *, extras: Any = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (module docstring): the clipped importance weight, detached, times A times logπ."""
    no_dual_clip("cispo", dual_clip)
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * advantages * log_probs
    ind = indicators(advantages, ratio.detach(), log_ratio, clip_low, clip_high, torch.zeros_like(advantages < 0))
    # CISPO clips the weight whatever the sign of A
    ind["clip_high"] = ratio.detach() > 1.0 + clip_high
    ind["clip_low"] = ratio.detach() < 1.0 - clip_low
    return loss, ind


def no_dual_clip(name: str, dual_clip: float | None) -> None:
    """The config's rule that loss ``name`` takes no dual-clip (the rule itself, not a copy)."""
    config_rules.check_dual_clip(name, dual_clip)


def indicators(advantages: Tensor, ratio: Tensor, log_ratio: Tensor, clip_low, clip_high,
               dual_active: Tensor) -> dict[str, Tensor]:
    """The maps every loss returns: PPO's clip conditions (by default), the ratio and the log-ratio."""
    return {
        "clip_high": (advantages > 0) & (ratio > 1.0 + clip_high),
        "clip_low": (advantages < 0) & (ratio < 1.0 - clip_low),
        "clip_dual": dual_active,
        "ratio": ratio.detach(),
        "log_ratio": log_ratio.detach(),
    }


def per_token_policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                          clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
                          name: str, response_mask: Tensor | None = None,
                          extras: Any = None) -> tuple[Tensor, dict[str, Tensor]]:
    """The unreduced loss ``[B, T]`` of policy loss ``name`` and its indicator maps. The settings
    are ``algorithm.*``'s values (no defaults here: they exist once, in the schema)."""
    if response_mask is None:
        response_mask = torch.ones_like(log_probs)
    return POLICY_LOSSES.get(name)(log_probs, old_log_probs, advantages, response_mask, clip_low, clip_high,
                                   dual_clip, extras=extras)


def policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor, clip: Clip,
                agg: Aggregation, *, name: str, metrics_mask: Tensor | None = None, token_weight: Tensor | None = None,
                extras: Any = None) -> tuple[Tensor, dict[str, float]]:
    """Loss ``name`` (``algorithm.policy_loss``, module docstring) reduced by ``agg``, and its metrics.

    ``response_mask``: a response's valid tokens (what GSPO's sequence ratio averages over, and what
    ``agg`` divides over unless its own mask is set, e.g. one Lopti phase's tokens under
    ``normalize=phase``). ``metrics_mask`` (default: ``response_mask``) selects the tokens the metrics
    describe, e.g. one Lopti phase's tokens while the loss is still normalised by all tokens.
    ``token_weight`` multiplies the per-token loss. Metrics: ``clip_frac_low``, ``clip_frac_high``,
    ``clip_frac_dual`` (fractions of those tokens where each clip is active), ``approx_kl`` (mean of
    logπ_old − logπ, the k1 estimate of KL(π_old‖π_θ)), ``ratio_mean``, ``ratio_max``, ``ratio_min``,
    ``tokens`` (how many tokens they describe) and ``pg_loss``, the mean per-token loss over them.
    """
    loss_tok, ind = per_token_policy_loss(log_probs, old_log_probs, advantages, clip.low, clip.high, clip.dual,
                                          name=name, response_mask=response_mask, extras=extras)
    if token_weight is not None:
        loss_tok = loss_tok * token_weight.detach()
    loss = agg(loss_tok, response_mask)
    return loss, _metrics(loss_tok, ind, response_mask if metrics_mask is None else metrics_mask)


def _metrics(loss_tok: Tensor, ind: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
    mm = mask.bool()
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
            "pg_loss": float((loss_tok * mm).sum() / n),
        }
    return metrics
