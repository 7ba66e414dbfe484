"""The full per-micro-batch objective the learner back-propagates.

    loss = PG(A_phase, m; w) + β · agg(KL ⊙ m_phase, m) − c_H · agg(H ⊙ m_phase, m)

* ``PG`` is :func:`~arlopti.algorithms.policy_loss.policy_loss` (``cfg.policy_loss``) on the phase's
  advantages: the estimator's, AR-weighted (:mod:`.reweighting`), zeroed outside the phase's tokens
  (:mod:`.isolation`);
* the β·KL term is there only with ``cfg.kl_in == "loss"``; with ``"reward"`` β already acted on
  the token rewards before the advantages and KL is only measured;
* ``m`` is the **full** response mask: every term is normalised by all valid tokens (or
  sequences), not by the phase's own, which is the official behaviour (``lopti.normalize=all``).
  With ``normalize=phase`` the phase's own tokens are the mask and the denominator instead;
* the KL (against the frozen reference) and the entropy bonus are masked to the phase's
  tokens ``m_phase``, so over the two Lopti phases each token's KL counts exactly once.

``scale`` (:class:`~arlopti.algorithms.aggregation.LossScale`) carries the learner's mini-batch-wide,
all-rank denominator and the horizon of ``seq-mean-token-sum-norm``. ``cfg`` is the run's
:class:`~arlopti.config.AlgorithmConfig` (its defaults are the schema's, stated once).

``shaping`` (:class:`Shaping`): a per-token change of the loss precomputed by a method above the core
(:mod:`arlopti.plugins.shaping`: a token method, the rollout-mismatch correction, what a registered loss
reads beyond the ratio). Without one the result is GRPO / AR / Lopti exactly.

Metrics (all over the phase's tokens, so that phases and micro-batches combine by a token-weighted
mean, ``tokens`` being the weight): the policy-loss metrics, and ``pg_loss``, ``kl``, ``entropy`` and
``loss`` as per-token means (``loss = pg_loss + β·kl − c_H·entropy``), whatever ``loss_agg``
normalises the back-propagated value by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor

from arlopti.algorithms.aggregation import Aggregation, LossScale
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.policy_loss import CORE_LOSSES, Clip, policy_loss
from arlopti.config import AlgorithmConfig, LoptiConfig
from arlopti.config.check import check_setting


@dataclass(frozen=True)
class Shaping:
    """A precomputed per-token change of the loss (module docstring). Every tensor is detached ``[B, T]``;
    a None field (or no penalty) changes nothing."""

    adv_weight: Tensor | None = None  # A_t ← w_t·A_t before the policy loss
    loss_weight: Tensor | None = None  # each token's policy loss (and penalties) × w_t; the normaliser unchanged
    clip_low: Tensor | None = None  # per-token PPO bounds in place of algorithm.clip_low / clip_high
    clip_high: Tensor | None = None
    kl_weight: Tensor | None = None  # each token's β·KL × c_t
    penalties: tuple[Callable[[Tensor], Tensor], ...] = ()  # extra per-token terms f(logπ_θ), same aggregation
    loss_inputs: Any = None  # what the configured policy loss reads beyond the ratio (opaque to the core)
    own_count: float | None = None  # the method's own denominator, used where ``scale`` gives none


def grpo_objective(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
                   phase_mask: Tensor, cfg: AlgorithmConfig, ref_log_probs: Tensor | None = None,
                   entropy: Tensor | None = None, scale: LossScale | None = None,
                   shaping: Shaping | None = None) -> tuple[Tensor, dict[str, float]]:
    """Loss of one micro-batch for one phase (module docstring). Returns (loss, metrics)."""
    if shaping is None and (cfg.token_method.name != "none" or cfg.policy_loss not in CORE_LOSSES):
        raise ValueError(f"algorithm.token_method.name={cfg.token_method.name} with algorithm.policy_loss="
                         f"{cfg.policy_loss} reads a shaping: pass shaping=arlopti.plugins.shaping.shaping_for(...)")
    s = shaping or Shaping()
    check_setting(LoptiConfig, "normalize", cfg.lopti.normalize, "algorithm.lopti")  # the schema's choices
    phase_mask = phase_mask.to(log_probs.dtype)
    denom_mask = response_mask.to(log_probs.dtype) if cfg.lopti.normalize == "all" else phase_mask
    scale = scale or LossScale()
    if scale.value is None and s.own_count is not None:
        scale = LossScale(s.own_count, scale.horizon)
    agg = Aggregation(cfg.loss_agg, denom_mask, scale)
    adv = advantages * phase_mask
    if s.adv_weight is not None:
        adv = adv * s.adv_weight.to(adv.dtype)
    clip = Clip(cfg.clip_low if s.clip_low is None else s.clip_low.to(adv.dtype),
                cfg.clip_high if s.clip_high is None else s.clip_high.to(adv.dtype), cfg.dual_clip)
    loss, metrics = policy_loss(log_probs, old_log_probs, adv, response_mask, clip, agg, name=cfg.policy_loss,
                                metrics_mask=phase_mask, token_weight=s.loss_weight, extras=s.loss_inputs)
    per_token = metrics["pg_loss"]
    for penalty in s.penalties:  # as if added to those tokens' policy loss (verl adds them to pg_losses)
        pen = penalty(log_probs) * phase_mask
        if s.loss_weight is not None:
            pen = pen * s.loss_weight.detach()
        loss = loss + agg(pen)
        per_token += token_mean(pen, phase_mask)
    if cfg.kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("algorithm.kl_coef > 0 needs reference log-probs")
        kl_tok = kl_penalty(log_probs, ref_log_probs, cfg.kl_estimator) * phase_mask
        if s.kl_weight is not None:
            kl_tok = kl_tok * s.kl_weight.to(kl_tok.dtype)
        metrics["kl"] = token_mean(kl_tok, phase_mask)
        if cfg.kl_in == "loss":
            loss = loss + cfg.kl_coef * agg(kl_tok)
            per_token += cfg.kl_coef * metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = token_mean(entropy * phase_mask, phase_mask)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * agg(entropy * phase_mask)
            per_token -= cfg.entropy_coef * metrics["entropy"]
    metrics["loss"] = per_token
    return loss, metrics


def token_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of ``values`` over ``mask``'s tokens, detached (0 without a token)."""
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1))
