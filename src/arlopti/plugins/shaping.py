"""What the options hand the core objective for one micro-batch: one :class:`~arlopti.algorithms.objective.Shaping`.

:func:`shaping_for` gathers, from the run's config and the micro-batch's forward:

* the token method's :class:`~arlopti.plugins.token_methods.TokenShaping` (``algorithm.token_method``),
  computed from this call's own detached inputs: its advantage weight, its keep mask (folded into the
  loss weight), its per-token clip bounds and KL weight, and KL-Cov's ``κ_t·|logπ − logπ_old|`` and
  Lp-Reg's ``κ_t·KL_lv(π ‖ π′)`` as penalties under the same aggregation;
* the rollout-mismatch correction's weight (:mod:`.mismatch`), which multiplies each token's loss;
* what a rival loss reads beyond the ratio (:class:`~arlopti.plugins.rival_losses.LossExtras`): its
  settings, the entropy, SimKO's top-K log-probs, the engine's log-probs (DPPO's anchor).

* SAPO's empty-row count (``loss_params.sapo_empty_rows=zero``) of this micro-batch, the objective's
  denominator where the caller gives no mini-batch count (``own_count``).

:func:`effective_weights` is the per-bucket multiplier of each token's gradient relative to GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arlopti.algorithms.objective import Shaping
from arlopti.config import AlgorithmConfig
from arlopti.ops.tile_stats import TokenStats
from arlopti.plugins.buckets import BUCKET_NAMES, bucket_index
from arlopti.plugins.rival_losses import LossExtras, empty_rows, row_count
from arlopti.plugins.token_methods import TokenShaping, make_context, token_shaping


@dataclass(frozen=True)
class Forward:
    """What one micro-batch's training forward gives the options beyond its log-probs: the per-token
    entropy, the full-distribution statistics a method asked for (:mod:`.forward_needs`), the rollout
    engine's log-probs of the sampled tokens, and the rollout-mismatch weight (None: no correction)."""

    entropy: Tensor | None = None
    dist: TokenStats | None = None
    engine_log_probs: Tensor | None = None
    correction: Tensor | None = None


def shaping_for(a: AlgorithmConfig, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                response_mask: Tensor, phase_mask: Tensor, forward: Forward) -> Shaping:
    """The :class:`Shaping` of one micro-batch and phase (module docstring). ``advantages`` are the
    core's (after AR, before the phase mask), as :func:`~arlopti.algorithms.objective.grpo_objective`
    receives them."""
    phase = phase_mask.to(log_probs.dtype)
    adv = advantages * phase
    method = None
    if a.token_method.name != "none":
        method = token_shaping(make_context(log_probs, old_log_probs, adv, response_mask, phase, forward.entropy,
                                            a.clip_low, a.clip_high, forward.dist), a.token_method)
    weight = forward.correction
    if method is not None and method.keep is not None:
        keep = method.keep.to(adv.dtype)
        weight = keep if weight is None else weight * keep
    top = None if forward.dist is None else forward.dist.top_log_probs
    extras = LossExtras(a.loss_params, forward.entropy, top, forward.engine_log_probs)
    count = _own_count(a, response_mask, phase)
    if method is None:
        return Shaping(loss_weight=weight, loss_inputs=extras, own_count=count)
    return Shaping(adv_weight=method.adv_weight, loss_weight=weight, clip_low=method.clip_low,
                   clip_high=method.clip_high, kl_weight=method.kl_weight,
                   penalties=_penalties(method, old_log_probs), loss_inputs=extras, own_count=count)


def _penalties(method: TokenShaping, old_log_probs: Tensor) -> tuple:
    """KL-Cov's and Lp-Reg's per-token terms, as functions of the current log-probs (verl and Lp-Reg add
    them to ``pg_losses`` before ``agg_loss``)."""
    terms = []
    if method.abs_log_ratio_coef is not None:
        coef = method.abs_log_ratio_coef
        terms.append(lambda lp: coef.to(lp.dtype) * (lp - old_log_probs.detach()).abs())
    if method.proxy_kl_coef is not None:
        coef_p, proxy = method.proxy_kl_coef, method.proxy_log_probs
        terms.append(lambda lp: coef_p.to(lp.dtype) * proxy_kl(lp, proxy))
    return tuple(terms)


def proxy_kl(log_probs: Tensor, proxy_log_probs: Tensor) -> Tensor:
    """Lp-Reg's per-token KL toward the proxy, ``kl_penalty(log_prob, tgt_log_prob, "low_var_kl")`` of its
    repository: d = logπ′ − logπ, ``min(max(e^d − d − 1, −10), 10)`` (no clamp of d itself; on Lp-Reg's
    tokens d > 0, where this equals the core's ``low_var_kl``, which also clamps d to [−5, 5])."""
    d = proxy_log_probs.detach() - log_probs
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)


def _own_count(a: AlgorithmConfig, response_mask: Tensor, phase: Tensor) -> float | None:
    """Where the run's seq-mean modes count empty rows as zeros (SAPO's ``loss_params.sapo_empty_rows=zero``,
    :func:`~arlopti.plugins.rival_losses.empty_rows`), this micro-batch's count of rows B over the objective's
    denominator mask (``phase``: the phase mask in the log-probs' dtype); None under the core's rule."""
    rows = empty_rows(a)
    if rows == "skip":
        return None
    denom = response_mask.to(phase.dtype) if a.lopti.normalize == "all" else phase
    return row_count(denom, a.loss_agg, rows)


def effective_weights(advantages: Tensor, shaping: Shaping, base_advantages: Tensor, old_log_probs: Tensor,
                      phase_mask: Tensor) -> dict[str, float]:
    """How much each token's policy gradient is scaled relative to GRPO, per bucket of p_old.

    At ratio 1 (no clip active) a token's gradient is −A_t·c_t·∇logπ_t, against GRPO's
    −A_base,t·∇logπ_t, so its multiplier is m_t = A_t·c_t / A_base,t: AR's weight times the token
    method's advantage weight and keep mask times the rollout correction's weight. ``advantages`` are
    the core's (after AR); per-token clip bounds and penalties act only off ratio 1 and are not in it.
    Over the phase's tokens with A_base ≠ 0: ``effective_weight/<b>`` the mean m_t in bucket ``<b>``
    (:data:`arlopti.plugins.buckets.BUCKET_NAMES`) and ``effective_weight_tokens/<b>`` their count
    (the learner weighs the means by it). Over the two Lopti phases each token counts once.
    """
    with torch.no_grad():
        adv = advantages * phase_mask.to(advantages.dtype)
        if shaping.adv_weight is not None:
            adv = adv * shaping.adv_weight.to(adv.dtype)
        c = adv.detach().float() if shaping.loss_weight is None else (adv * shaping.loss_weight).detach().float()
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
