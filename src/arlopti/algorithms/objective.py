"""The full per-micro-batch objective the learner back-propagates.

    loss = PG(A_phase, m) + β · agg(KL ⊙ m_phase, m) − c_H · agg(H ⊙ m_phase, m)

* ``PG`` is :func:`~arlopti.algorithms.policy_loss.policy_loss` on the phase's advantages
  (already zero outside the phase: AR-weighted, then Lopti-masked);
* ``m`` is the **full** response mask: every term is normalised by all valid tokens (or
  sequences), not by the phase's own, which is the official behaviour (``normalize="all"``).
  With ``normalize="phase"`` the phase's own tokens are the mask and the denominator instead;
* the KL (against the frozen reference) and the entropy bonus are masked to the phase's
  tokens ``m_phase``, so over the two Lopti phases each token's KL counts exactly once.

``scale`` and ``horizon`` are forwarded to :func:`~arlopti.algorithms.aggregation.aggregate`
(the learner passes the mini-batch-wide, all-rank count there).

``cfg`` is any object with the fields of :class:`LossConfig`: the learner passes its
``AlgorithmConfig`` itself (nothing is copied field by field); tests and analysis build a
``LossConfig``.

Metrics (all over the phase's tokens, so that phases and micro-batches combine by a
token-weighted mean, ``tokens`` being the weight): the policy-loss metrics of
:func:`~arlopti.algorithms.policy_loss.policy_loss`, and ``pg_loss``, ``kl``, ``entropy`` and
``loss`` as per-token means (``loss = pg_loss + β·kl − c_H·entropy``), whatever ``loss_agg``
normalises the back-propagated value by.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from arlopti.algorithms.aggregation import aggregate
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.policy_loss import policy_loss


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.24
    dual_clip: float | None = 10.0
    loss_agg: str = "token-mean"
    kl_coef: float = 0.001
    kl_estimator: str = "low_var_kl"
    entropy_coef: float = 0.0


def grpo_objective(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
                   phase_mask: Tensor, cfg: LossConfig, ref_log_probs: Tensor | None = None,
                   entropy: Tensor | None = None, scale: float | None = None, horizon: int | None = None,
                   normalize: str = "all") -> tuple[Tensor, dict[str, float]]:
    """Loss of one micro-batch for one phase (module docstring). Returns (loss, metrics)."""
    if normalize not in ("all", "phase"):
        raise ValueError(f"algorithm.lopti.normalize={normalize!r}: use 'all' (official) or 'phase'")
    phase_mask = phase_mask.to(log_probs.dtype)
    denom_mask = response_mask.to(log_probs.dtype) if normalize == "all" else phase_mask
    adv = advantages * phase_mask
    loss, metrics = policy_loss(log_probs, old_log_probs, adv, denom_mask, cfg.clip_low, cfg.clip_high,
                                cfg.dual_clip, cfg.loss_agg, scale=scale, horizon=horizon, metrics_mask=phase_mask,
                                with_token_loss=True)
    per_token = metrics["pg_loss"]
    if cfg.kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("algorithm.kl_coef > 0 needs reference log-probs")
        kl_tok = kl_penalty(log_probs, ref_log_probs, cfg.kl_estimator) * phase_mask
        loss = loss + cfg.kl_coef * aggregate(kl_tok, denom_mask, cfg.loss_agg, scale=scale, horizon=horizon)
        metrics["kl"] = _token_mean(kl_tok, phase_mask)
        per_token += cfg.kl_coef * metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = _token_mean(entropy * phase_mask, phase_mask)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(entropy * phase_mask, denom_mask, cfg.loss_agg, scale=scale,
                                                       horizon=horizon)
            per_token -= cfg.entropy_coef * metrics["entropy"]
    metrics["loss"] = per_token
    return loss, metrics


def _token_mean(values: Tensor, mask: Tensor) -> float:
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1))
