"""The low-probability-token rivals' policy losses (``algorithm.policy_loss``; registry ``POLICY_LOSSES``).

Each maps ``(logπ_θ, logπ_old, A, mask, ε_low, ε_high, c; extras)`` to an unreduced per-token loss
``[B, T]`` and the indicator maps of :mod:`arlopti.algorithms.policy_loss` (``clip_low`` / ``clip_high``: the tokens the
method stops or bounds, per side of A; ``clip_dual``: its second bound), aggregated afterwards by
``algorithm.loss_agg``. With ρ_t = exp(logπ_θ,t − sg[logπ_old,t]), the log-ratio clamped to [−20, 20]
as in every loss here (the peers marked "unclamped" below do not clamp; the clamp changes values only
beyond ρ = e^±20). ``sg`` is stop-gradient. Restated from the peers' code named in each function, read
with the search tools; never copied.

How AR and Lopti enter: each loss's gradient at token t is proportional to A_t (SimKO's top-K term
too), so AR's weight scales it and Lopti's phase mask (A_t = 0) leaves a token with exactly zero
gradient, as for the losses of :mod:`arlopti.algorithms.policy_loss` (tests/plugins/test_rival_losses.py). AR's weight
is positive, so the sign of A, which picks each loss's branch, never changes.

Which settings each reads (the schema's, :class:`arlopti.config.schema.LossParamsConfig`):
``dppo_tv``/``dppo_kl``: ``clip_low``/``clip_high`` as the divergence thresholds δ_low/δ_high and
``dual_clip`` as the truncation c of the detached ratio (verl's ``clip_ratio_c``); ``sapo``: the two
temperatures and how its row mean counts an empty row (``sapo_empty_rows``, :func:`empty_rows`); ``ce_gppo``: the clip, the dual-clip and β₁/β₂; ``aspo``: the clip and ``dual_clip`` as
its soft dual clip; ``simko``: the clip, K, λ, the entropy quantile and the negative scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from arlopti.algorithms.aggregation import normaliser
from arlopti.algorithms.policy_loss import indicators, no_dual_clip, token_log_ratio
from arlopti.config.registries import POLICY_LOSSES
from arlopti.config.schema import LossParamsConfig


@dataclass(frozen=True)
class LossExtras:
    """What a rival loss reads beyond the ratio and the clip (the core's opaque ``extras``,
    :mod:`arlopti.plugins.shaping` builds it): its settings, the current forward's per-token entropy
    ``[B, T]`` and top-K log-probs ``[B, T, K]`` (with gradient), and the rollout engine's log-probs of
    the sampled tokens ``[B, T]`` (DPPO's engine anchor). None: the schema's defaults, nothing else."""

    params: LossParamsConfig = field(default_factory=LossParamsConfig)
    entropy: Tensor | None = None
    top_log_probs: Tensor | None = None
    behaviour_log_probs: Tensor | None = None


def _none_active(advantages: Tensor) -> Tensor:
    return torch.zeros_like(advantages < 0)


def _dppo(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, valid: Tensor,
          dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's shared loss: ``l_t = −A_t · sg[min(ρ_t, c)] · logπ_θ,t · valid_t`` (valid detached)."""
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    weight = ratio if dual_clip is None else ratio.clamp(max=dual_clip)
    valid = valid.detach()
    loss = -advantages * weight.detach() * log_probs * valid.to(log_probs.dtype)
    ind = indicators(advantages, ratio.detach(), log_ratio, 0.0, 0.0, _none_active(advantages))
    ind["clip_high"] = (advantages > 0) & ~valid
    ind["clip_low"] = (advantages < 0) & ~valid
    ind["clip_dual"] = valid & (ratio.detach() > dual_clip) if dual_clip is not None else _none_active(advantages)
    return loss, ind


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
                 clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
                 extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region", arXiv 2602.04879; restated from
    verl's ``compute_policy_loss_dppo_tv``, read in a copy of verl's ``verl/trainer/ppo/core_algos.py``,
    and sail-sg/Stable-RL's ``_compute_token_mask_for_policy_loss``, mode ``dppo_binary_tv_recompute``)::

        p = π_θ(o_t), p_old = π_old(o_t)
        valid_t = (p − p_old ≤ δ_high)  if A_t > 0,   (p − p_old ≥ −δ_low)  otherwise
        l_t     = −A_t · sg[min(ρ_t, c)] · logπ_θ,t · valid_t

    A token leaves the trust region when the *probability* (not the ratio) moved more than δ in the
    direction its advantage pushes; it then gets no gradient. Inside, the gradient is −A·min(ρ, c):
    the ratio is a detached importance weight (as in CISPO), not clipped. δ = ``clip_low``/``clip_high``
    (verl's script: 0.15 both), c = ``dual_clip`` (verl's ``clip_ratio_c``; Stable-RL's default 10,
    verl's example script 10000, i.e. none; null: no truncation).

    The anchor, where the peers differ: verl anchors the mask and the ratio at ``old_log_prob`` and
    recommends ``bypass_mode=True``, which makes that the rollout engine's log-probs; Stable-RL's default
    ``dppo_binary_tv`` anchors both at the engine's log-probs, its ``*_recompute`` variant the mask at the
    trainer's recomputed π_old. Here both are anchored at π_old (the trainer's recomputation at the
    rollout temperature, the loss's ``old_log_probs``), verl's as written. With the colocated HF engine in
    fp32 π_old equals the engine's log-probs to rounding, so the anchors agree; under a numerically
    different engine (vLLM, bf16) they differ by the rollout/trainer mismatch. ``loss_params.dppo_anchor``
    switches: ``old`` (default, verl's as written) or ``engine`` (Stable-RL's default, and verl under
    ``bypass_mode``): both the mask and the detached ratio are then measured from the engine's
    log-probs (:func:`dppo_anchor`)."""
    anchor = dppo_anchor(old_log_probs, extras)
    p, p_old = torch.exp(log_probs.detach()), torch.exp(anchor.detach())
    valid = torch.where(advantages > 0, p - p_old <= clip_high, p - p_old >= -clip_low)
    return _dppo(log_probs, anchor, advantages, valid, dual_clip)


def dppo_anchor(old_log_probs: Tensor, extras: LossExtras | None) -> Tensor:
    """The log-probs DPPO measures from: π_old, or with ``loss_params.dppo_anchor=engine`` the engine's
    (:attr:`LossExtras.behaviour_log_probs`; an error when the learner passed none)."""
    ex = extras or LossExtras()
    if ex.params.dppo_anchor != "engine":
        return old_log_probs
    if ex.behaviour_log_probs is None:  # the run's rule, stated once (a ConfigError is a ValueError)
        from arlopti.config.rules import check_dppo_anchor

        check_dppo_anchor("dppo_tv", "engine", return_logprobs=False)
    return ex.behaviour_log_probs


def binary_kl(old_log_probs: Tensor, log_probs: Tensor) -> Tensor:
    """KL(Bern(p_old) ‖ Bern(p)) of the sampled token, verl's and Stable-RL's form (1e-8 guards, as theirs)::

        p_old·(logπ_old − logπ) + (1 − p_old)·log((1 − p_old + 1e-8) / (1 − p + 1e-8))"""
    p, p_old = torch.exp(log_probs), torch.exp(old_log_probs)
    return p_old * (old_log_probs - log_probs) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
                 clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
                 extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (arXiv 2602.04879; verl's ``compute_policy_loss_dppo_kl``, Stable-RL's
    ``dppo_binary_kl_recompute``): as :func:`dppo_tv_loss`, with the divergence the binary KL
    (:func:`binary_kl`, on detached log-probs) and a token outside only when it moved the way its
    advantage pushes::

        valid_t = (KL_t ≤ δ_high) ∨ (p ≤ p_old)  if A_t > 0,   (KL_t ≤ δ_low) ∨ (p ≥ p_old)  otherwise
        l_t     = −A_t · sg[min(ρ_t, c)] · logπ_θ,t · valid_t

    verl's script: δ 0.05 both. The anchor: as :func:`dppo_tv_loss` (``loss_params.dppo_anchor``)."""
    anchor = dppo_anchor(old_log_probs, extras)
    lp, old = log_probs.detach(), anchor.detach()
    kl = binary_kl(old, lp)
    p, p_old = torch.exp(lp), torch.exp(old)
    valid = torch.where(advantages > 0, (kl <= clip_high) | (p <= p_old), (kl <= clip_low) | (p >= p_old))
    return _dppo(log_probs, anchor, advantages, valid, dual_clip)


@POLICY_LOSSES.register("sapo")
def sapo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
              clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
              extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO, soft adaptive policy optimisation (Qwen, arXiv 2511.20347; restated from verl's
    ``compute_policy_loss_sapo`` and TRL's ``GRPOTrainer._compute_loss`` with ``loss_type="sapo"``, which
    agree)::

        τ_t = τ_pos if A_t > 0 else τ_neg          (A = 0 takes τ_neg, as both peers)
        f_t = σ(τ_t·(ρ_t − 1)) · 4 / τ_t,     l_t = −f_t · A_t

    A soft gate instead of a hard clip: ∂f/∂logπ = 4·σ(1 − σ)·ρ, which is ρ·sech²(τ(ρ − 1)/2): 1 at
    ρ = 1 (plain GRPO on-policy) and decaying smoothly away from it, so no token's gradient is cut off
    at a bound. τ = ``loss_params.sapo_tau_pos`` / ``sapo_tau_neg`` (both peers: 1, 1.05); the clip
    bounds are not read, and SAPO takes no dual-clip. TRL does not clamp the log-ratio; verl does (±20).

    Aggregation: both peers force ``seq-mean-token-mean``; here it is ``algorithm.loss_agg`` and
    ``kk_sapo`` sets ``seq-mean-token-mean``. The peers agree on the mean of each response's token
    mean, and differ on a response with no valid token (``algorithm.dapo.mask_truncated``'s, or a
    Lopti phase's under ``normalize=phase``): verl's ``agg_loss`` without a ``global_batch_size`` (its
    legacy FSDP actor, the default worker up to v0.7) averages over the S rows with a valid token;
    TRL's ``GRPOTrainer._compute_loss`` (``loss_type="sapo"``, ``(...).mean()``) over all B rows of
    the batch, an empty one counting as 0, and so do verl's engine workers (the only ones from v0.8,
    ``global_batch_size`` = the mini-batch's rows). Loss and gradient then differ by B/S. Ours is a
    switch, ``loss_params.sapo_empty_rows`` (:func:`empty_rows`): ``skip`` (S, the default) or
    ``zero`` (B); :mod:`arlopti.algorithms.aggregation` applies it."""
    no_dual_clip("sapo", dual_clip)
    params = (extras or LossExtras()).params
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, params.sapo_tau_pos),
                      torch.full_like(ratio, params.sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    none = _none_active(advantages)
    ind = indicators(advantages, ratio.detach(), log_ratio, 0.0, 0.0, none)
    ind["clip_high"], ind["clip_low"] = none, none.clone()  # nothing is clipped
    return -gate * advantages, ind


def empty_rows(algorithm) -> str:
    """How the seq-mean aggregations of a run count a response with no valid token
    (:data:`EMPTY_ROWS`, :func:`row_count`): ``algorithm.loss_params.sapo_empty_rows`` under
    ``policy_loss=sapo`` (:func:`sapo_loss`), ``skip`` under every other loss."""
    return algorithm.loss_params.sapo_empty_rows if algorithm.policy_loss == "sapo" else "skip"


#: How the seq-mean modes count a row with no valid token (:func:`row_count`).
EMPTY_ROWS = ("skip", "zero")


def row_count(mask: Tensor, agg: str, rows: str = "skip") -> float:
    """The loss's denominator over ``mask [B, T]`` under the empty-row rule ``rows``: ``skip`` is the core's
    :func:`~arlopti.algorithms.aggregation.normaliser` (valid tokens for ``token-mean``, else S, the rows
    with a valid token); ``zero`` counts every row, B, an empty one as a zero row mean (TRL's GRPO/SAPO
    ``(...).mean()``; verl's engine workers since v0.8; docs/algorithms.md compares the two). With an empty
    row they differ by B/S, in loss and gradient; ``token-mean`` has no rows."""
    if rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows={rows!r}: use one of {', '.join(EMPTY_ROWS)}")
    if rows == "zero" and agg != "token-mean":
        normaliser(mask, agg)  # validates the name
        return float(mask.shape[0])
    return normaliser(mask, agg)


@POLICY_LOSSES.register("ce_gppo")
def ce_gppo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
                 clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
                 extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CE-GPPO, gradient-preserving clipping (Kwai, arXiv 2509.20712; restated from Kwai-Klear/CE-GPPO's
    ``compute_gppo_loss_general_beta`` in ``verl/trainer/ppo/core_algos.py``)::

        low_t  = ρ_t < 1 − ε_low  ∧ A_t < 0,      high_t = ρ_t > 1 + ε_high ∧ A_t > 0
        l_t    = −β₁·(1 − ε_low)·(ρ_t / sg[ρ_t])·A_t     on low_t
                 −β₂·(1 + ε_high)·(ρ_t / sg[ρ_t])·A_t    on high_t
                 −ρ_t·A_t                                 elsewhere
        l_t    = min(l_t, −A_t·c)                         where A_t < 0 (PPO's dual-clip)

    The value is PPO's clipped one (times β), but a clipped token keeps the bounded gradient
    −β·(1 ∓ ε)·A·∇logπ instead of none; elsewhere ``−ρ·A`` equals PPO's max(−ρA, −clip(ρ)A) (the
    other side of each bound is never clipped by PPO either). β₁ = ``loss_params.gppo_beta_low``,
    β₂ = ``gppo_beta_high``; β₁ = β₂ = 1 is GPPO (suu990901/KlearReasoner's ``compute_gppo_loss``, whose
    clamp-with-``ρ/sg[ρ]``-bounds form gives the same values and gradients). The peers disagree on β₁:
    the function's default 0.25, the README's listing 0.75, the scripts 0.5 (1.5B) and 0.75 (7B); the
    schema takes 0.75. CE-GPPO does not clamp the log-ratio."""
    params = (extras or LossExtras()).params
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    unit = ratio / ratio.detach()
    low = (ratio.detach() < 1.0 - clip_low) & (advantages < 0)
    high = (ratio.detach() > 1.0 + clip_high) & (advantages > 0)
    loss = torch.where(low, -params.gppo_beta_low * (1.0 - clip_low) * unit * advantages,
                       torch.where(high, -params.gppo_beta_high * (1.0 + clip_high) * unit * advantages,
                                   -ratio * advantages))
    dual = _none_active(advantages)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    ind = indicators(advantages, ratio.detach(), log_ratio, clip_low, clip_high, dual)
    return loss, ind


@POLICY_LOSSES.register("aspo")
def aspo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor | None,
              clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
              extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """ASPO, asymmetric importance sampling (Wang et al. 2025, arXiv 2510.06062; restated from
    wizard-III/Archer2.0's ``compute_policy_loss_archer`` in ``verl/trainer/ppo/core_algos.py``)::

        A_t < 0:  r̃ = max(ρ_t, 1 − ε_low),   l_t = −A_t·r̃              (PPO's lower clip, no upper)
                  if r̃ > c:                  l_t = −A_t·sg[c]·logπ_θ,t  (soft dual clip)
        A_t > 0:  r̃ = min(ρ_t, 1 + ε_high),  l_t = −A_t·(r̃ / sg[r̃]) / sg[r̃]   (the flipped ratio)
                  if 1/r̃ > c:                l_t = −A_t·sg[c]·logπ_θ,t

    Positive tokens are weighted by 1/ρ instead of ρ: the gradient −A·∇logπ/ρ grows for a token whose
    probability fell since the rollout and shrinks for one that rose, which is ASPO's point against
    over-amplifying already likely tokens. The soft dual clip keeps a gradient (−A·c·∇logπ, CISPO-like)
    where PPO's dual clip gives none: for A < 0 above ρ = c, for A > 0 below ρ = 1/c. c = ``dual_clip``
    (Archer2.0: 3 on both sides; null: no dual clip). Archer2.0 also uses entropy-dependent bounds
    (ε = 0.2 on tokens at or below the response's 0.8 entropy quantile, 0.4 above): that is this loss
    with ``token_method=archer`` (its per-token ε), as ``kk_aspo`` sets. A = 0 tokens: zero loss."""
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    neg_r = torch.maximum(ratio, torch.as_tensor(1.0 - clip_low, dtype=ratio.dtype))
    pos_r = torch.minimum(ratio, torch.as_tensor(1.0 + clip_high, dtype=ratio.dtype))
    neg, pos = -advantages * neg_r, -advantages * (pos_r / pos_r.detach()) / pos_r.detach()
    dual = _none_active(advantages)
    if dual_clip is not None:
        neg_dual, pos_dual = neg_r.detach() > dual_clip, 1.0 / pos_r.detach() > dual_clip
        soft = -advantages * dual_clip * log_probs
        neg, pos = torch.where(neg_dual, soft, neg), torch.where(pos_dual, soft, pos)
        dual = ((advantages < 0) & neg_dual) | ((advantages > 0) & pos_dual)
    loss = torch.where(advantages < 0, neg, pos)
    return loss, indicators(advantages, ratio.detach(), log_ratio, clip_low, clip_high, dual)


def _high_entropy(entropy: Tensor, response_mask: Tensor, quantile: float) -> Tensor:
    """Per response, H_t > the ``quantile`` of H over its valid tokens (linear interpolation; strict,
    as SimKO's ``entropy > threshold``)."""
    valid = response_mask.bool()
    h = entropy.detach().float()
    q = torch.nanquantile(torch.where(valid, h, torch.full_like(h, float("nan"))), quantile, dim=-1, keepdim=True)
    return valid & (h > q)


@POLICY_LOSSES.register("simko")
def simko_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
               clip_low: float | Tensor, clip_high: float | Tensor, dual_clip: float | None, *,
               extras: LossExtras | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """SimKO, simple pass@K optimisation (Peng et al. 2025, arXiv 2510.14807; restated from the paper's
    code, CLR-Lab/SimKO's ``compute_policy_loss_simko`` in ``verl/trainer/ppo/core_algos.py`` and the
    top-K forward of its ``dp_actor.py``)::

        w_t   = H_t > q_b                  (q_b: the response's ``simko_entropy_quantile`` of H, 0.8)
        top_t = sg[ρ_t] · Σ_k exp(logπ_θ(v_k) − sg[logπ_θ(v_k)])     (v_1..v_K: the position's top-K)
        ρ'_t  = (1 − λw_t)·ρ_t + (λw_t / K)·top_t      where A_t > 0, else ρ_t
        A'_t  = s·A_t   where A_t < 0 ∧ w_t ∧ o_t is the position's top-1,   else A_t
        l_t   = max(−A'_t·ρ'_t, −A'_t·clip(ρ'_t, 1 − ε_low, 1 + ε_high))

    The value of ρ' is ρ (each top-K term is worth ρ), so PPO's clip acts as usual; its gradient on a
    high-entropy A > 0 token is −A·[(1 − λ)ρ·∇logπ(o_t) + (λ/K)·ρ·Σ_k ∇logπ(v_k)]: a share λ of the push
    goes to the K most likely candidates, spreading probability over them ("boost the top-K of correct
    responses"); a wrong response's top-1 tokens at high entropy are pushed down s times harder.
    K = ``simko_top_k`` (3), λ = ``simko_mix`` (0.01), s = ``simko_neg_scale`` (1.1, hard-coded in the
    code), ε: SimKO's single ``cliprange`` (``kk_simko`` sets 0.2 both sides); no dual clip.

    Details, stated: SimKO marks correct responses by ``reward == 1`` (its math reward) and wrong ones by
    a negative response advantage; here the sign of the token's advantage (after AR and the Lopti mask)
    decides, which is the same for 0/1 rewards (a correct response with A = 0 has zero loss either way).
    Its ratio is unclamped and its top-K term divides by ``sg[ρ_k] + 1e-8`` (value ρ(1 − 1e-8/ρ_k));
    ours is exact. "Top-1" is ``logπ_θ(o_t) ≥ max_v logπ_θ(v)`` (a tie for the maximum counts; SimKO's
    argmax picks one of the tied tokens). The top-K log-probs and H are this forward's (the fused
    log-prob pass, ``StatsRequest(top_k=K)``): the old policy's top-K that SimKO also passes in only
    enters its term through that 1e-8 and is not needed."""
    no_dual_clip("simko", dual_clip)
    ex = extras or LossExtras()
    if ex.top_log_probs is None or ex.entropy is None:
        raise ValueError("algorithm.policy_loss=simko needs the forward's top-K log-probs and entropy "
                         "(shaping_for(..., Forward(entropy=..., dist=TokenStats with top_log_probs)))")
    p = ex.params
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    top = ex.top_log_probs
    k = top.shape[-1]
    high = _high_entropy(ex.entropy, response_mask, p.simko_entropy_quantile).to(ratio.dtype)
    lam = p.simko_mix * high
    top_term = ratio.detach() * torch.exp(top - top.detach()).sum(-1)
    mixed = torch.where(advantages > 0, (1.0 - lam) * ratio + (lam / k) * top_term, ratio)
    top1 = log_probs.detach() >= top[..., 0].detach()
    adv = torch.where((advantages < 0) & (high > 0) & top1, advantages * p.simko_neg_scale, advantages)
    loss = torch.maximum(-adv * mixed, -adv * torch.clamp(mixed, 1.0 - clip_low, 1.0 + clip_high))
    return loss, indicators(advantages, ratio.detach(), log_ratio, clip_low, clip_high, _none_active(advantages))
