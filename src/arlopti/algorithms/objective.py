"""The full per-micro-batch objective the learner back-propagates.

    loss = PG(A_phase, m; w) + β · agg(KL ⊙ m_phase, m) − c_H · agg(H ⊙ m_phase, m)

* ``PG`` is :func:`~arlopti.algorithms.policy_loss.policy_loss` (``cfg.policy_loss``: ``ppo_clip``,
  ``gspo``, ``cispo`` or a rival of :mod:`.rival_losses`) on the phase's advantages (already zero outside the phase: AR-weighted,
  then Lopti-masked), each token's loss times ``w`` (``token_weight``: the rollout-mismatch
  correction of :mod:`.mismatch`, 1 without one);
* the β·KL term is there only with ``cfg.kl_in == "loss"``; with ``"reward"`` β already acted on
  the token rewards before the advantages (:mod:`.advantages`) and KL is only measured;
* ``m`` is the **full** response mask: every term is normalised by all valid tokens (or
  sequences), not by the phase's own, which is the official behaviour (``normalize="all"``).
  With ``normalize="phase"`` the phase's own tokens are the mask and the denominator instead;
* the KL (against the frozen reference) and the entropy bonus are masked to the phase's
  tokens ``m_phase``, so over the two Lopti phases each token's KL counts exactly once.

With a token method (``cfg.token_method.name`` other than ``none``, :mod:`.token_methods`), its
:class:`~.token_methods.TokenShaping` is computed from this call's own (detached) inputs and
applied: ``A ← w·A``, the keep mask multiplies each token's policy loss (with ``token_weight``),
per-token clip bounds replace ``clip_low``/``clip_high``, the KL term is weighted per token, and
KL-Cov's ``κ_t·|logπ − logπ_old|`` and Lp-Reg's ``κ_t·KL_lv(π ‖ π′)`` are added under the same
aggregation. Without one (``token_method.name=none``), the result is bit-identical to before the
field existed.

``dist`` (:class:`arlopti.ops.tile_stats.TokenStats` of this forward, from the fused log-prob pass):
the full-distribution statistics a method reads — SimKO's top-K log-probs (with their gradient),
Lp-Reg's proxy log-probs. :func:`arlopti.algorithms.forward_needs.forward_stats` says which a config needs.

``scale`` and ``horizon`` are forwarded to :func:`~arlopti.algorithms.aggregation.aggregate`
(the learner passes the mini-batch-wide, all-rank count there). Without ``scale``, a run whose
seq-mean modes count empty rows as zeros (SAPO's ``loss_params.sapo_empty_rows=zero``,
:func:`~arlopti.algorithms.rival_losses.empty_rows`) divides by this micro-batch's rows B.

``cfg`` is the run's :class:`~arlopti.config.AlgorithmConfig` (the learner passes its own; tests and
analysis build one, e.g. ``LossConfig(kl_coef=0.0)``): its defaults are the schema's, stated once.

Metrics (all over the phase's tokens, so that phases and micro-batches combine by a
token-weighted mean, ``tokens`` being the weight): the policy-loss metrics of
:func:`~arlopti.algorithms.policy_loss.policy_loss`, and ``pg_loss``, ``kl``, ``entropy`` and
``loss`` as per-token means (``loss = pg_loss + β·kl − c_H·entropy``), whatever ``loss_agg``
normalises the back-propagated value by.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.algorithms.aggregation import aggregate, normaliser
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.policy_loss import policy_loss
from arlopti.algorithms.token_methods import TokenShaping, make_context, token_shaping
from arlopti.algorithms.policy_loss import LossExtras
from arlopti.algorithms.rival_losses import empty_rows
from arlopti.config import AlgorithmConfig, LoptiConfig
from arlopti.config.check import check_setting
from arlopti.ops.tile_stats import TokenStats

#: The objective's settings are ``algorithm.*`` themselves: ``LossConfig(kl_coef=0.0)`` is an
#: :class:`~arlopti.config.AlgorithmConfig` with the schema's defaults elsewhere (no second copy).
LossConfig = AlgorithmConfig


def grpo_objective(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
                   phase_mask: Tensor, cfg: AlgorithmConfig, ref_log_probs: Tensor | None = None,
                   entropy: Tensor | None = None, scale: float | None = None, horizon: int | None = None,
                   normalize: str = "all", token_weight: Tensor | None = None,
                   base_advantages: Tensor | None = None, dist: TokenStats | None = None,
                   behaviour_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Loss of one micro-batch for one phase (module docstring). Returns (loss, metrics).

    ``base_advantages`` (the estimator's, before AR): when given, the metrics also hold the
    effective weight per bucket (:func:`effective_weights`). ``behaviour_log_probs``: the rollout
    engine's log-probs of the sampled tokens, for a loss anchored at them (DPPO's ``dppo_anchor=engine``)."""
    check_setting(LoptiConfig, "normalize", normalize, "algorithm.lopti")  # the schema's choices, not a copy
    phase_mask = phase_mask.to(log_probs.dtype)
    denom_mask = response_mask.to(log_probs.dtype) if normalize == "all" else phase_mask
    if scale is None and empty_rows(cfg) != "skip":  # every aggregate below (loss, KL, entropy) counts B rows
        scale = normaliser(denom_mask, cfg.loss_agg, empty_rows(cfg))
    adv = advantages * phase_mask
    method = cfg.token_method
    shaping = None
    clip_low, clip_high = cfg.clip_low, cfg.clip_high
    if method.name != "none":
        shaping = token_shaping(make_context(log_probs, old_log_probs, adv, response_mask, phase_mask, entropy,
                                             cfg.clip_low, cfg.clip_high, dist), method)
        adv, token_weight, clip_low, clip_high = _apply_shaping(shaping, adv, token_weight, clip_low, clip_high)
    loss, metrics = policy_loss(log_probs, old_log_probs, adv, denom_mask, clip_low, clip_high,
                                cfg.dual_clip, cfg.loss_agg, scale=scale, horizon=horizon, metrics_mask=phase_mask,
                                with_token_loss=True, name=cfg.policy_loss,
                                token_weight=token_weight, ratio_mask=response_mask,
                                extras=LossExtras(cfg.loss_params, entropy,
                                                  None if dist is None else dist.top_log_probs, behaviour_log_probs))
    if base_advantages is not None:
        metrics.update(effective_weights(adv, token_weight, base_advantages, old_log_probs, phase_mask))
    per_token = metrics["pg_loss"]
    if shaping is not None:
        loss, per_token = _add_shaping_terms(shaping, loss, per_token, log_probs, old_log_probs, phase_mask,
                                             denom_mask, token_weight, cfg, scale, horizon)
    if cfg.kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("algorithm.kl_coef > 0 needs reference log-probs")
        kl_tok = kl_penalty(log_probs, ref_log_probs, cfg.kl_estimator) * phase_mask
        if shaping is not None and shaping.kl_weight is not None:
            kl_tok = kl_tok * shaping.kl_weight.to(kl_tok.dtype)
        metrics["kl"] = _token_mean(kl_tok, phase_mask)
        if cfg.kl_in == "loss":
            loss = loss + cfg.kl_coef * aggregate(kl_tok, denom_mask, cfg.loss_agg, scale=scale, horizon=horizon)
            per_token += cfg.kl_coef * metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = _token_mean(entropy * phase_mask, phase_mask)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(entropy * phase_mask, denom_mask, cfg.loss_agg, scale=scale,
                                                       horizon=horizon)
            per_token -= cfg.entropy_coef * metrics["entropy"]
    metrics["loss"] = per_token
    return loss, metrics


def effective_weights(advantages: Tensor, token_weight: Tensor | None, base_advantages: Tensor,
                      old_log_probs: Tensor, phase_mask: Tensor) -> dict[str, float]:
    """How much each token's policy gradient is scaled relative to GRPO, per bucket of p_old.

    At ratio 1 (no clip active) a token's gradient is −A_t·c_t·∇logπ_t, against GRPO's
    −A_base,t·∇logπ_t, so its multiplier is m_t = A_t·c_t / A_base,t: AR's weight times the token
    method's advantage weight and keep mask times the rollout correction's weight (``token_weight``).
    Per-token clip bounds (Archer) and penalties (KL-Cov) act only off ratio 1 and are not in it.
    Over the phase's tokens with A_base ≠ 0: ``effective_weight/<b>`` the mean m_t in bucket ``<b>``
    (:data:`arlopti.algorithms.buckets.BUCKET_NAMES`) and ``effective_weight_tokens/<b>`` their count
    (the learner weighs the means by it). Over the two Lopti phases each token counts once.
    """
    from arlopti.algorithms.buckets import BUCKET_NAMES, bucket_index

    with torch.no_grad():
        c = advantages.detach().float() if token_weight is None else (advantages * token_weight).detach().float()
        base = base_advantages.detach().float()
        valid = phase_mask.bool() & (base != 0)
        m = torch.where(valid, c / torch.where(valid, base, torch.ones_like(base)), torch.zeros_like(base))
        b = bucket_index(torch.exp(old_log_probs.detach().float()).clamp(0.0, 1.0))
        out = {}
        for i, name in enumerate(BUCKET_NAMES):
            sel = valid & (b == i)
            n = int(sel.sum())
            out[f"effective_weight_tokens/{name}"] = float(n)
            if n:
                out[f"effective_weight/{name}"] = float(m[sel].mean())
    return out


def _apply_shaping(shaping: TokenShaping, adv: Tensor, token_weight: Tensor | None, clip_low, clip_high):
    """A token method's advantage weight, keep mask (folded into the per-token loss weight) and
    per-token clip bounds (module docstring of :mod:`.token_methods`)."""
    if shaping.adv_weight is not None:
        adv = adv * shaping.adv_weight.to(adv.dtype)
    if shaping.keep is not None:
        keep = shaping.keep.to(adv.dtype)
        token_weight = keep if token_weight is None else token_weight * keep
    if shaping.clip_low is not None:
        clip_low = shaping.clip_low.to(adv.dtype)
    if shaping.clip_high is not None:
        clip_high = shaping.clip_high.to(adv.dtype)
    return adv, token_weight, clip_low, clip_high


def _add_shaping_terms(shaping: TokenShaping, loss: Tensor, per_token: float, log_probs: Tensor,
                       old_log_probs: Tensor, phase_mask: Tensor, denom_mask: Tensor, token_weight: Tensor | None,
                       cfg, scale, horizon) -> tuple[Tensor, float]:
    """KL-Cov's + κ_t·|logπ − logπ_old| and Lp-Reg's + κ_t·KL_lv(π ‖ π′) on the phase's tokens, times
    the per-token loss weight, under the same aggregation: the same as adding them to those tokens'
    policy loss (verl and Lp-Reg add them to ``pg_losses`` before ``agg_loss``). No new metric tags
    (docs/metrics.md lists what is written)."""
    terms = []
    if shaping.abs_log_ratio_coef is not None:
        terms.append(shaping.abs_log_ratio_coef.to(log_probs.dtype) * (log_probs - old_log_probs.detach()).abs())
    if shaping.proxy_kl_coef is not None:
        terms.append(shaping.proxy_kl_coef.to(log_probs.dtype) * proxy_kl(log_probs, shaping.proxy_log_probs))
    for term in terms:
        pen = term * phase_mask
        if token_weight is not None:
            pen = pen * token_weight.detach()
        loss = loss + aggregate(pen, denom_mask, cfg.loss_agg, scale=scale, horizon=horizon)
        per_token += _token_mean(pen, phase_mask)
    return loss, per_token


def proxy_kl(log_probs: Tensor, proxy_log_probs: Tensor) -> Tensor:
    """Lp-Reg's per-token KL toward the proxy, ``kl_penalty(log_prob, tgt_log_prob, "low_var_kl")`` of its
    repository: d = logπ′ − logπ, ``min(max(e^d − d − 1, −10), 10)`` (no clamp of d itself; on Lp-Reg's
    tokens d > 0, where this equals :mod:`.kl`'s ``low_var_kl``, which also clamps d to [−5, 5])."""
    d = proxy_log_probs.detach() - log_probs
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)


def _token_mean(values: Tensor, mask: Tensor) -> float:
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1))
