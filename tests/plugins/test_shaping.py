"""arlopti.plugins.shaping: a token method's TokenShaping (and the rollout-mismatch correction) reach the
core objective only through ``shaping_for``; the result is, bit for bit, what the objective computed when
it applied the token method itself (before the core/plugins split). The reference below restates that
objective's steps from the TokenShaping fields, in the same order: A <- A·phase·w, the keep mask folded
into the per-token loss weight (with the correction), per-token clip bounds, the policy loss times that
weight under the run's aggregation, + KL-Cov's κ|logπ − logπ_old| and Lp-Reg's κ·KL_lv(π ‖ π′) on the
phase's tokens times the weight, + β·KL (times the method's KL weight) − c_H·H. And the core refuses a
token method or a rival loss that gets no shaping."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import grpo_objective
from arlopti.algorithms.aggregation import LossScale, aggregate
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.policy_loss import per_token_policy_loss
from arlopti.config import AlgorithmConfig, LoptiConfig, TokenMethodConfig
from arlopti.ops.tile_stats import TokenStats
from arlopti.plugins.shaping import Forward, shaping_for
from arlopti.plugins.token_methods import make_context, token_shaping

# each method with settings under which it acts on the batch below (asserted in the test)
METHODS = {
    "clip_cov": dict(cov_ratio=0.2, clip_cov_lb=0.05),
    "kl_cov": dict(cov_ratio=0.2, kl_cov_coef=0.7),
    "lp_reg": dict(lp_reg_neg_share=0.5, lp_reg_pos_share=0.4, lp_reg_coef=0.8),
    "top_entropy": dict(entropy_top=0.3),
    "archer": dict(archer_high_entropy_kl=0.5),
    "tr_grpo": {},
    "reverse": {},
}
# (loss_agg, lopti.normalize, the learner's scale)
AGGS = [pytest.param("token-mean", "all", LossScale(), id="token-mean"),
        pytest.param("seq-mean-token-sum-norm", "phase", LossScale(7.0, 16), id="sum-norm-by-phase-scaled")]


def _batch():
    g = torch.Generator().manual_seed(3)
    b, t = 4, 10
    old = -torch.rand(b, t, generator=g) * 5 - 0.01
    logp = torch.minimum(old + 0.4 * torch.randn(b, t, generator=g), torch.full((b, t), -1e-4))
    adv = torch.randn(b, 1, generator=g).expand(b, t) * torch.linspace(0.7, 1.0, t)  # AR-like per-token weights
    mask = torch.ones(b, t)
    mask[3, 6:] = 0
    mask[2, 8:] = 0
    ent = torch.rand(b, t, generator=g) * 3
    proxy = logp + torch.rand(b, t, generator=g) * 1.5 - 0.3  # Lp-Reg's proxy, mostly above logπ
    proxy[1, 2] = -math.inf  # a token the min-p filter calls noise
    ref = old + 0.2 * torch.randn(b, t, generator=g)
    correction = 0.5 + torch.rand(b, t, generator=g)  # a rollout-mismatch weight
    low = ((torch.exp(old) < 0.2) & mask.bool()).float()  # a Lopti phase
    return old, logp, adv * mask, mask, ent, proxy, ref, correction, low


def _cfg(method, agg, normalize):
    return AlgorithmConfig(kl_coef=0.1, kl_in="loss", entropy_coef=0.01, loss_agg=agg,
                           lopti=LoptiConfig(normalize=normalize),
                           token_method=TokenMethodConfig(name=method, **METHODS.get(method, {})))


def old_objective(cfg, lp, old, adv, mask, phase, ent, dist, ref, correction, scale):
    """The pre-split grpo_objective's loss with a token method, restated from the TokenShaping fields."""
    phase = phase.to(lp.dtype)
    denom = mask.to(lp.dtype) if cfg.lopti.normalize == "all" else phase
    a = adv * phase
    ts = token_shaping(make_context(lp, old, a, mask, phase, ent, cfg.clip_low, cfg.clip_high, dist),
                       cfg.token_method)
    if ts.adv_weight is not None:
        a = a * ts.adv_weight.to(a.dtype)
    w = correction
    if ts.keep is not None:
        keep = ts.keep.to(a.dtype)
        w = keep if w is None else w * keep
    clip_low = cfg.clip_low if ts.clip_low is None else ts.clip_low.to(a.dtype)
    clip_high = cfg.clip_high if ts.clip_high is None else ts.clip_high.to(a.dtype)

    def agg(x):
        return aggregate(x, denom, cfg.loss_agg, scale=scale.value, horizon=scale.horizon)

    tok, _ = per_token_policy_loss(lp, old, a, clip_low, clip_high, cfg.dual_clip, name=cfg.policy_loss,
                                   response_mask=mask)
    if w is not None:
        tok = tok * w.detach()
    loss = agg(tok)
    terms = []
    if ts.abs_log_ratio_coef is not None:  # KL-Cov
        terms.append(ts.abs_log_ratio_coef.to(lp.dtype) * (lp - old.detach()).abs())
    if ts.proxy_kl_coef is not None:  # Lp-Reg: its low_var_kl, min(max(e^d - d - 1, -10), 10), d = logπ′ - logπ
        d = ts.proxy_log_probs.detach() - lp
        terms.append(ts.proxy_kl_coef.to(lp.dtype) * (torch.exp(d) - d - 1).clamp(-10.0, 10.0))
    for term in terms:
        pen = term * phase
        if w is not None:
            pen = pen * w.detach()
        loss = loss + agg(pen)
    kl = kl_penalty(lp, ref, cfg.kl_estimator) * phase
    if ts.kl_weight is not None:
        kl = kl * ts.kl_weight.to(kl.dtype)
    loss = loss + cfg.kl_coef * agg(kl)
    loss = loss - cfg.entropy_coef * agg(ent * phase)
    return loss, ts


def _acts(method, ts, phase):
    """The method changes something on this batch's phase (the comparison is not vacuous)."""
    pop = phase.bool()
    if method in ("clip_cov", "top_entropy"):
        return bool((~ts.keep & pop).any())
    if method == "kl_cov":
        return bool((ts.abs_log_ratio_coef[pop] > 0).any())
    if method == "lp_reg":
        return bool((ts.proxy_kl_coef[pop] > 0).any())
    if method == "archer":
        return bool((ts.clip_low[pop] != ts.clip_low[pop][0]).any() and (ts.kl_weight[pop] != 1).any())
    return bool((ts.adv_weight[pop] != 1).any())


@pytest.mark.parametrize("agg,normalize,scale", AGGS)
@pytest.mark.parametrize("with_correction", [False, True], ids=["no-correction", "correction"])
@pytest.mark.parametrize("lopti_phase", [False, True], ids=["all-tokens", "low-phase"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_shaping_for_equals_the_old_objective_bit_for_bit(method, lopti_phase, with_correction, agg, normalize,
                                                          scale):
    old, logp0, adv, mask, ent, proxy, ref, correction, low = _batch()
    phase = low if lopti_phase else mask
    correction = correction if with_correction else None
    dist = TokenStats(min_p_log_prob=proxy)
    cfg = _cfg(method, agg, normalize)

    lp = logp0.clone().requires_grad_(True)
    shaping = shaping_for(cfg, lp, old, adv, mask, phase, Forward(ent, dist, None, correction))
    loss, _ = grpo_objective(lp, old, adv, mask, phase, cfg, ref, ent, scale, shaping)
    loss.backward()

    lp_ref = logp0.clone().requires_grad_(True)
    ref_loss, ts = old_objective(cfg, lp_ref, old, adv, mask, phase, ent, dist, ref, correction, scale)
    ref_loss.backward()

    assert _acts(method, ts, phase)
    assert torch.equal(loss, ref_loss)
    assert torch.equal(lp.grad, lp_ref.grad)
    none = _cfg("none", agg, normalize)
    plain, _ = grpo_objective(logp0, old, adv, mask, phase, none, ref, ent, scale,
                              shaping_for(none, logp0, old, adv, mask, phase, Forward(ent, dist, None, correction)))
    assert not torch.equal(loss.detach(), plain)  # the method changed the loss


@pytest.mark.parametrize("algo", [dict(token_method=TokenMethodConfig(name="kl_cov")),
                                  dict(token_method=TokenMethodConfig(name="archer")),
                                  dict(policy_loss="sapo", dual_clip=None),
                                  dict(policy_loss="dppo_tv")])
def test_the_core_refuses_a_token_method_or_a_rival_loss_without_a_shaping(algo):
    old, logp, adv, mask, ent, *_ = _batch()
    cfg = AlgorithmConfig(kl_coef=0.0, **algo)
    with pytest.raises(ValueError, match=rf"algorithm\.token_method\.name={cfg.token_method.name} with "
                                         rf"algorithm\.policy_loss={cfg.policy_loss} reads a shaping: pass "
                                         r"shaping=arlopti\.plugins\.shaping\.shaping_for"):
        grpo_objective(logp, old, adv, mask, mask, cfg, entropy=ent)
    shaping = shaping_for(cfg, logp, old, adv, mask, mask, Forward(ent))
    loss, _ = grpo_objective(logp, old, adv, mask, mask, cfg, entropy=ent, shaping=shaping)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name,dual", [("ppo_clip", 10.0), ("gspo", None), ("cispo", None)])
def test_the_core_losses_need_no_shaping_and_an_empty_one_changes_nothing(name, dual):
    old, logp, adv, mask, ent, *_ = _batch()
    cfg = AlgorithmConfig(policy_loss=name, dual_clip=dual, kl_coef=0.0)
    loss, _ = grpo_objective(logp, old, adv, mask, mask, cfg, entropy=ent)
    shaped, _ = grpo_objective(logp, old, adv, mask, mask, cfg, entropy=ent,
                               shaping=shaping_for(cfg, logp, old, adv, mask, mask, Forward(ent)))
    assert torch.equal(loss, shaped)
