"""The rivals' policy losses (DPPO-TV/KL, SAPO, CE-GPPO, ASPO, SimKO): hand-computed values and gradients,
edge cases (p near 0 and 1, a ratio of 20, an empty mask), a restatement of each peer's code that agrees
with ours on loss values and gradients, and the compositions with AR and Lopti.

The restatements are written here from the peers' code read with the search tools (never imported):
verl's ``compute_policy_loss_dppo_tv`` / ``_dppo_kl`` / ``_sapo``, Stable-RL's mask of
``_compute_token_mask_for_policy_loss``, TRL's ``sapo`` branch of ``GRPOTrainer._compute_loss``,
Kwai-Klear/CE-GPPO's ``compute_gppo_loss_general_beta``, KlearReasoner's ``compute_gppo_loss``,
Archer2.0's ``compute_policy_loss_archer`` with its ``dp_actor`` entropy mask, and CLR-Lab/SimKO's
``compute_policy_loss_simko``. Several peers write the loss as ``-A * sg(w) * log pi``, whose value is
not the surrogate's: the gradients are the comparison that matters, so every test checks both.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import POLICY_LOSSES, grpo_objective
from arlopti.algorithms.aggregation import LossScale
from arlopti.config import AlgorithmConfig
from arlopti.algorithms.policy_loss import per_token_policy_loss
from arlopti.plugins.rival_losses import LossExtras
from arlopti.plugins.rival_losses import binary_kl
from arlopti.plugins.shaping import Forward, shaping_for
from arlopti.config import ConfigError, RunConfig, TokenMethodConfig, validate_run
from arlopti.config.schema import LossParamsConfig
from arlopti.ops.tile_stats import TokenStats

RIVALS = ["dppo_tv", "dppo_kl", "sapo", "ce_gppo", "aspo", "simko"]


def _token_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def _grad(fn, logp):
    lp = logp.clone().requires_grad_(True)
    loss = fn(lp)
    loss.backward()
    return loss.detach(), lp.grad


def _objective(lp, old, adv, mask, phase, cfg, entropy=None, dist=None, scale=None):
    """grpo_objective as the learner calls it: the rival's inputs (and SAPO's own row count, used where no
    scale is given) through shaping_for."""
    shaping = shaping_for(cfg, lp, old, adv, mask, phase, Forward(entropy, dist))
    return grpo_objective(lp, old, adv, mask, phase, cfg, entropy=entropy, scale=LossScale(scale), shaping=shaping)


def _ours(name, clip=(0.2, 0.2), dual=None, extras=None):
    def fn(lp, old, adv, mask):
        loss, _ = per_token_policy_loss(lp, old, adv, *clip, dual, name=name, response_mask=mask, extras=extras)
        return _token_mean(loss, mask)
    return fn


# ------------------------------------------------------------------------------------------------ DPPO

# p_old -> p per token: a rare token raised 20x (1e-4 -> 2e-3), a likely one raised past the TV bound
# (0.5 -> 0.7), a near-certain one dropped hard (0.99 -> 0.8), a small move (0.3 -> 0.35), padding.
P_OLD = torch.tensor([[1e-4, 0.5, 0.99, 0.3, 0.5]])
P_NEW = torch.tensor([[2e-3, 0.7, 0.8, 0.35, 0.5]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def verl_dppo_tv(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """verl's compute_policy_loss_dppo_tv, restated (token-mean)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, (prob - old_prob) <= clip_high, (prob - old_prob) >= -clip_low)
    losses = -advantages * truncated * log_prob * valid.detach().float()
    return _token_mean(losses, response_mask)


def verl_dppo_kl(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """verl's compute_policy_loss_dppo_kl, restated (token-mean)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log((1.0 - old_prob + 1e-8) /
                                                                           (1.0 - prob + 1e-8))
    valid = torch.where(advantages > 0, (kl <= clip_high) | (prob <= old_prob), (kl <= clip_low) | (prob >= old_prob))
    losses = -advantages * truncated * log_prob * valid.detach().float()
    return _token_mean(losses, response_mask)


def stable_rl_mask(mode, rollout_log_prob, log_prob, advantages, clip_low, clip_high):
    """Stable-RL's valid mask for dppo_binary_tv / dppo_binary_kl (anchored at the rollout log-probs)."""
    prob, r_prob = torch.exp(log_prob), torch.exp(rollout_log_prob)
    if mode == "tv":
        bad_pos, bad_neg = (prob - r_prob) > clip_high, (prob - r_prob) < -clip_low
    else:
        kl = r_prob * (rollout_log_prob - log_prob) + (1 - r_prob) * torch.log((1.0 - r_prob + 1e-8) / (1.0 - prob + 1e-8))
        bad_pos, bad_neg = (kl > clip_high) & (prob > r_prob), (kl > clip_low) & (prob < r_prob)
    return 1.0 - torch.where(advantages > 0, bad_pos, bad_neg).float()


def test_dppo_tv_by_hand_keeps_the_ratio_20_token_and_stops_the_big_probability_moves():
    old, logp = torch.log(P_OLD), torch.log(P_NEW)
    loss, grad = _grad(lambda lp: _ours("dppo_tv", (0.15, 0.15), 10.0)(lp, old, ADV, MASK), logp)
    n = 4
    # token 0: ratio 20 but |dp| = 0.0019 < 0.15: kept, weight min(20, c = 10); tokens 1, 2: |dp| = 0.2, 0.19
    # beyond 0.15 in the direction A pushes: no gradient; token 3: dp = +0.05 against A < 0: kept, weight 1.1667
    expected = torch.tensor([[-10.0, 0.0, 0.0, 0.35 / 0.3, 0.0]]) / n
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    _, ind = per_token_policy_loss(logp, old, ADV, 0.15, 0.15, 10.0, name="dppo_tv", response_mask=MASK)
    assert ind["clip_high"].tolist() == [[False, True, False, False, False]]
    assert ind["clip_low"].tolist() == [[False, False, True, False, False]]
    assert ind["clip_dual"].tolist() == [[True, False, False, False, False]]  # the ratio truncated at c
    # PPO-clip on the same tokens: the ratio-20 token is clipped (no gradient), the 0.99 -> 0.8 drop is not
    from arlopti.algorithms.policy_loss import ppo_clip_loss
    _, ppo_grad = _grad(lambda lp: _token_mean(ppo_clip_loss(lp, old, ADV, MASK, 0.2, 0.28, None)[0], MASK), logp)
    assert ppo_grad[0, 0] == 0 and ppo_grad[0, 2] != 0


@pytest.mark.parametrize("name,ref,mode", [("dppo_tv", verl_dppo_tv, "tv"), ("dppo_kl", verl_dppo_kl, "kl")])
@pytest.mark.parametrize("c", [3.0, 10.0, None])
def test_dppo_equals_verl_and_stable_rl(name, ref, mode, c):
    g = torch.Generator().manual_seed(1)
    old = torch.log(torch.rand(6, 9, generator=g).clamp(1e-5, 1 - 1e-5))
    logp = old + 0.6 * torch.randn(6, 9, generator=g)
    logp = torch.minimum(logp, torch.full_like(logp, -1e-6))  # a probability
    adv = torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    delta = (0.15, 0.15) if mode == "tv" else (0.05, 0.05)
    r_loss, r_grad = _grad(lambda lp: ref(old, lp, adv, mask, *delta, 1e30 if c is None else c), logp)
    o_loss, o_grad = _grad(lambda lp: _ours(name, delta, c)(lp, old, adv, mask), logp)
    torch.testing.assert_close(o_loss, r_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(o_grad, r_grad, rtol=1e-6, atol=1e-7)
    # Stable-RL's mask, anchored at the rollout log-probs, is verl's when those are the recomputed pi_old
    _, ind = per_token_policy_loss(logp, old, adv, *delta, c, name=name, response_mask=mask)
    ours_valid = ~(ind["clip_high"] | ind["clip_low"])
    assert torch.equal(ours_valid[adv != 0], stable_rl_mask(mode, old, logp, adv, *delta).bool()[adv != 0])
    assert 0 < int((~ours_valid & mask.bool()).sum()) < int(mask.sum())  # both kinds of token occur


def test_binary_kl_by_hand_and_at_the_extremes():
    # p_old = 0.5 -> p = 0.7: 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3) = 0.0872
    assert binary_kl(torch.log(torch.tensor(0.5)), torch.log(torch.tensor(0.7))).item() == pytest.approx(
        0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3), rel=1e-5)
    same = torch.log(torch.tensor([1e-9, 0.999999]))
    assert torch.allclose(binary_kl(same, same), torch.zeros(2), atol=1e-6)  # p = p_old: 0 even near 0 and 1
    assert torch.isfinite(binary_kl(torch.log(torch.tensor([0.999999])), torch.log(torch.tensor([1e-9])))).all()


# ------------------------------------------------------------------------------------------------ SAPO


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg, clamp=True):
    """verl's compute_policy_loss_sapo (clamp=True) and TRL's sapo branch (clamp=False), restated per token."""
    d = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(d, -20.0, 20.0) if clamp else d)
    taus = torch.where(advantages > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    return -(torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)) * advantages


def test_sapo_by_hand_on_policy_and_at_a_ratio_of_20():
    p = LossExtras(LossParamsConfig(sapo_tau_pos=1.0, sapo_tau_neg=1.05))
    old = torch.log(torch.tensor([[0.3, 0.3, 1e-4]]))
    logp = old + torch.tensor([[0.0, 0.0, math.log(20.0)]])
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, _ = per_token_policy_loss(logp, old, adv, 0.2, 0.2, None, name="sapo", extras=p)
    assert loss[0, 0].item() == pytest.approx(-2.0) and loss[0, 1].item() == pytest.approx(2.0 / 1.05)
    _, grad = _grad(lambda lp: per_token_policy_loss(lp, old, adv, 0.2, 0.2, None, name="sapo", extras=p)[0].sum(),
                    logp)
    # on-policy: d gate / d logp = 4 sigma'(0) * 1 = 1, so GRPO's -A; at ratio 20 the gate is flat: ~0
    assert grad[0, 0].item() == pytest.approx(-1.0) and grad[0, 1].item() == pytest.approx(1.0)
    assert abs(grad[0, 2].item()) < 1e-6


def test_sapo_equals_verl_and_trl():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 7, generator=g) * 4
    logp = old + 0.5 * torch.randn(4, 7, generator=g)
    adv = torch.randn(4, 7, generator=g)
    adv[0, :3] = 0.0  # A = 0 takes tau_neg in both peers (its loss is 0 either way)
    mask = torch.ones(4, 7)
    ex = LossExtras(LossParamsConfig(sapo_tau_pos=1.0, sapo_tau_neg=1.05))
    for clamp in (True, False):
        r_loss, r_grad = _grad(lambda lp: _token_mean(verl_sapo(old, lp, adv, mask, 1.0, 1.05, clamp), mask), logp)
        o_loss, o_grad = _grad(lambda lp: _ours("sapo", dual=None, extras=ex)(lp, old, adv, mask), logp)
        torch.testing.assert_close(o_loss, r_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(o_grad, r_grad, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------- CE-GPPO


def ce_gppo_general_beta(old_log_prob, log_prob, advantages, clip_low, clip_high, clip_ratio_c, beta1, beta2):
    """Kwai-Klear/CE-GPPO's compute_gppo_loss_general_beta, restated (per-token loss matrix)."""
    ratio = torch.exp(log_prob - old_log_prob)
    ratio_detached = ratio.detach()
    low_mask = (ratio < (1 - clip_low)) & (advantages < 0)
    high_mask = (ratio > (1 + clip_high)) & (advantages > 0)
    other = ~(low_mask | high_mask)
    losses = torch.zeros_like(advantages)
    losses[low_mask] = -beta1 * (1 - clip_low) / ratio_detached[low_mask] * ratio[low_mask] * advantages[low_mask]
    losses[high_mask] = -beta2 * (1 + clip_high) / ratio_detached[high_mask] * ratio[high_mask] * advantages[high_mask]
    losses[other] = -ratio[other] * advantages[other]
    capped = torch.min(-advantages * clip_ratio_c, losses)
    return torch.where(advantages < 0, capped, losses)


def klear_gppo(old_log_prob, log_prob, advantages, clip_low, clip_high, clip_ratio_c):
    """KlearReasoner's compute_gppo_loss (GPPO), restated (per-token loss matrix)."""
    ratio = torch.exp(log_prob - old_log_prob)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, (1 - clip_low) / ratio.detach() * ratio,
                                   (1 + clip_high) / ratio.detach() * ratio)
    clipped = torch.maximum(l1, l2)
    return torch.where(advantages < 0, torch.min(-advantages * clip_ratio_c, clipped), clipped)


def _ratio_cases():
    old = torch.log(torch.tensor([[0.2, 0.2, 0.2, 0.2, 1e-4, 0.6]]))
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 20.0, 1.05]])  # above / below the clip, both signs; a ratio of 20
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, -2.0, 1.0]])
    return old, old + torch.log(ratio), adv, torch.ones(1, 6)


def test_ce_gppo_by_hand_clipped_tokens_keep_a_bounded_gradient():
    old, logp, adv, mask = _ratio_cases()
    ex = LossExtras(LossParamsConfig(gppo_beta_low=0.5, gppo_beta_high=1.0))
    _, grad = _grad(lambda lp: per_token_policy_loss(lp, old, adv, 0.2, 0.2, 10.0, name="ce_gppo", extras=ex)[0].sum(),
                    logp)
    # [A>0, r 1.5: beta2 (1.2)] [A<0, r 0.5: beta1 0.8 = 0.4] [A>0, r 0.5: r] [A<0, r 1.5: r]
    # [A = -2, r 20: dual-capped at -A c = 20 < 40: 0] [r 1.05 inside: r]
    expected = torch.tensor([[-1.2, 0.4, -0.5, 1.5, 0.0, -1.05]])
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)


def test_ce_gppo_equals_ce_gppo_code_and_gppo_with_beta_one():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(5, 8, generator=g) * 3
    logp = old + 0.5 * torch.randn(5, 8, generator=g)
    adv = torch.randn(5, 8, generator=g)
    mask = torch.ones(5, 8)
    for b1, b2, ref in ((0.75, 1.0, ce_gppo_general_beta), (1.0, 1.0, ce_gppo_general_beta), (1.0, 1.0, None)):
        ex = LossExtras(LossParamsConfig(gppo_beta_low=b1, gppo_beta_high=b2))
        if ref is None:
            r = lambda lp: _token_mean(klear_gppo(old, lp, adv, 0.2, 0.2, 10.0), mask)  # noqa: E731
        else:
            r = lambda lp: _token_mean(ref(old, lp, adv, 0.2, 0.2, 10.0, b1, b2), mask)  # noqa: E731
        r_loss, r_grad = _grad(r, logp)
        o_loss, o_grad = _grad(lambda lp: _ours("ce_gppo", (0.2, 0.2), 10.0, ex)(lp, old, adv, mask), logp)
        torch.testing.assert_close(o_loss, r_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(o_grad, r_grad, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------ ASPO


def archer2_aspo(old_log_prob, log_prob, advantages, response_mask, entropy, clip_c=3.0):
    """Archer2.0: dp_actor's entropy mask (named high_entropy_mask, True on the tokens at or below the
    response's 0.8 entropy quantile) and compute_policy_loss_archer with the clip values it passes, restated."""
    masked = torch.where(response_mask.bool(), entropy, torch.nan)
    q80 = torch.nanquantile(masked, q=0.8, dim=-1, keepdim=True)
    low_entropy = (masked <= q80) & response_mask.bool()
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    neg_r = torch.where(low_entropy, torch.clamp(ratio, min=1 - 0.2), torch.clamp(ratio, min=1 - 0.4))
    pos_r = torch.where(low_entropy, torch.clamp(ratio, max=1 + 0.2), torch.clamp(ratio, max=1 + 0.4))
    neg_clip = -advantages * neg_r
    pos_clip = -advantages * (pos_r / pos_r.detach()) / pos_r.detach()
    neg_dual_mask = torch.gt(neg_r, torch.clamp(neg_r, max=clip_c))
    neg = torch.where(neg_dual_mask, -advantages * torch.clamp(neg_r, max=clip_c).detach() * log_prob, neg_clip)
    pos_dual = torch.clamp(1 / pos_r, max=clip_c)
    pos_dual_mask = torch.gt(1 / pos_r, pos_dual)
    pos = torch.where(pos_dual_mask, -advantages * pos_dual.detach() * log_prob, pos_clip)
    return _token_mean(torch.where(advantages < 0, neg, pos), response_mask)


def test_aspo_by_hand_flips_the_positive_ratio_and_soft_dual_clips():
    old = torch.log(torch.tensor([[0.2, 0.2, 0.2, 0.2, 1e-4, 0.2]]))
    ratio = torch.tensor([[0.5, 1.1, 0.25, 1.1, 20.0, 1.5]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, 1.0]])
    logp = old + torch.log(ratio)
    _, grad = _grad(lambda lp: per_token_policy_loss(lp, old, adv, 0.2, 0.2, 3.0, name="aspo")[0].sum(), logp)
    # A>0: weight 1/r (2, 1/1.1); r = 0.25 < 1/c: soft dual c = 3; A<0 r 1.1: r; r 20 > c: c; A>0 r 1.5 > 1.2: 0
    expected = torch.tensor([[-2.0, -1 / 1.1, -3.0, 1.1, 3.0, 0.0]])
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    # PPO would give -r to the A>0 tokens and 0 to both dual-clipped ones
    _, grad_no_dual = _grad(lambda lp: per_token_policy_loss(lp, old, adv, 0.2, 0.2, None, name="aspo")[0].sum(), logp)
    assert grad_no_dual[0, 2].item() == pytest.approx(-4.0) and grad_no_dual[0, 4].item() == pytest.approx(20.0)


def test_aspo_with_archer_bounds_equals_archer2():
    """Archer2.0's loss is ASPO with Archer's entropy-split bounds: ours is aspo + token_method=archer."""
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(4, 10, generator=g) * 3
    logp = old + 0.6 * torch.randn(4, 10, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 10).clone()
    mask = torch.ones(4, 10)
    mask[3, 6:] = 0
    adv = adv * mask
    ent = torch.rand(4, 10, generator=g) * 3
    cfg = AlgorithmConfig(policy_loss="aspo", dual_clip=3.0, kl_coef=0.0, clip_low=0.2, clip_high=0.2,
                          token_method=TokenMethodConfig(name="archer", archer_clip_low_entropy=0.2,
                                                         archer_clip_high_entropy=0.4, archer_high_entropy_kl=1.0))
    r_loss, r_grad = _grad(lambda lp: archer2_aspo(old, lp, adv, mask, ent), logp)
    o_loss, o_grad = _grad(lambda lp: _objective(lp, old, adv, mask, mask, cfg, entropy=ent)[0], logp)
    torch.testing.assert_close(o_loss, r_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(o_grad, r_grad, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------- SimKO


def simko_code(old_log_prob, log_prob, topk_log_probs, entropy, advantages, eos_mask, cliprange,
               token_level_scores, max_token, mix_topk_coef, tau):
    """CLR-Lab/SimKO's compute_policy_loss_simko, restated (its old top-K log-probs set to the current
    ones' values: they enter only through its 1e-8)."""
    correct = (token_level_scores.sum(-1) == 1).view(-1, 1).expand_as(log_prob)
    k = topk_log_probs.size(-1)
    r_bar = torch.exp((log_prob - old_log_prob).detach())
    diff_topk = topk_log_probs - topk_log_probs.detach()
    topk_sum = ((r_bar.unsqueeze(-1) / (torch.exp(diff_topk.detach()) + 1e-8)) * torch.exp(diff_topk)).sum(-1)
    thr = torch.stack([torch.quantile(entropy[b][eos_mask[b].bool()], tau) for b in range(entropy.shape[0])]).view(-1, 1)
    w = (entropy > thr).float()
    mix = mix_topk_coef * w * eos_mask
    ratio = torch.exp(log_prob - old_log_prob)
    ratio = torch.where(correct & eos_mask.bool(), (1.0 - mix) * ratio + (mix / k) * topk_sum, ratio)
    neg = (advantages.sum(-1) < 0).unsqueeze(-1) & (max_token > 0) & (entropy > thr)
    adv = advantages * torch.ones_like(advantages).masked_fill(neg, 1.1)
    losses = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange))
    return _token_mean(losses, eos_mask)


def _simko_batch(seed=5, b=4, t=9, v=12, k=3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g) * 2
    targets = torch.randint(0, v, (b, t), generator=g)
    targets[:, :3] = logits[:, :3].argmax(-1)  # some sampled tokens are their position's top-1
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv = (correct * 2 - 1).view(b, 1).expand(b, t).clone()  # GRPO's sign with 0/1 rewards
    old = torch.log_softmax(logits + 0.3 * torch.randn(b, t, v, generator=g), -1).gather(-1, targets[..., None])[..., 0]
    mask = torch.ones(b, t)
    mask[1, 7:] = 0
    scores = torch.zeros(b, t)
    scores[torch.arange(b), mask.sum(-1).long() - 1] = correct
    ent = torch.rand(b, t, generator=g) * 2
    return logits, targets, adv * mask, old, mask, scores, ent, k


def _simko_graph(logits, targets, k):
    lp_all = torch.log_softmax(logits, -1)
    ids = torch.topk(logits.detach(), k, -1).indices
    return lp_all.gather(-1, targets[..., None])[..., 0], lp_all.gather(-1, ids)


def test_simko_equals_simko_code_in_value_and_gradient():
    logits0, targets, adv, old, mask, scores, ent, k = _simko_batch()
    grads, losses = {}, {}
    for who in ("code", "ours"):
        logits = logits0.clone().requires_grad_(True)
        logp, top = _simko_graph(logits, targets, k)
        if who == "code":
            max_token = (logits.detach().argmax(-1) == targets).float()
            loss = simko_code(old, logp, top, ent, adv, mask, 0.2, scores, max_token, 0.01, 0.8)
        else:
            ex = LossExtras(LossParamsConfig(simko_top_k=k), ent, top)
            loss = _token_mean(per_token_policy_loss(logp, old, adv, 0.2, 0.2, None, name="simko", response_mask=mask,
                                                     extras=ex)[0], mask)
        loss.backward()
        grads[who], losses[who] = logits.grad, loss.detach()
    torch.testing.assert_close(losses["ours"], losses["code"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads["ours"], grads["code"], rtol=1e-5, atol=1e-8)


def test_simko_by_hand_moves_a_share_of_the_push_to_the_top_k():
    """One high-entropy A > 0 token on-policy: d loss / d logp_k = -A (lambda / K) for each top-K candidate,
    -A (1 - lambda) for the sampled token (plus its own top-K share if it is one of them)."""
    logp = torch.log(torch.tensor([[0.1, 0.3]])).requires_grad_(True)  # token 0: A > 0, not a top candidate
    top = torch.log(torch.tensor([[[0.4, 0.3], [0.4, 0.3]]])).requires_grad_(True)
    ent = torch.tensor([[2.0, 1.0]])  # token 0 is above its response's 0.5-quantile (1.5)
    ex = LossExtras(LossParamsConfig(simko_top_k=2, simko_mix=0.1, simko_entropy_quantile=0.5), ent, top)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    loss, _ = per_token_policy_loss(logp, logp.detach(), adv, 0.2, 0.2, None, name="simko", response_mask=mask,
                                    extras=ex)
    loss.sum().backward()
    assert loss[0, 0].item() == pytest.approx(-1.0, rel=1e-6)  # the value is the ratio's, 1
    assert logp.grad[0, 0].item() == pytest.approx(-0.9) and top.grad[0, 0].tolist() == pytest.approx([-0.05, -0.05])
    assert logp.grad[0, 1].item() == pytest.approx(1.0) and top.grad[0, 1].tolist() == [0.0, 0.0]  # low entropy


def test_simko_pushes_a_wrong_top1_high_entropy_token_down_harder():
    logp = torch.log(torch.tensor([[0.6, 0.6]])).requires_grad_(True)
    top = torch.log(torch.tensor([[[0.6], [0.7]]]))  # token 0 is its position's top-1, token 1 is not
    ent = torch.tensor([[2.0, 2.0]])
    ex = LossExtras(LossParamsConfig(simko_top_k=1, simko_entropy_quantile=0.0), ent, top)
    loss, _ = per_token_policy_loss(logp, logp.detach(), -torch.ones(1, 2), 0.2, 0.2, None, name="simko",
                                    response_mask=torch.ones(1, 2), extras=ex)
    loss.sum().backward()
    # quantile 0 of [2, 2] is 2: neither is strictly above -> no scaling; make token 0 the high one
    assert logp.grad.tolist() == [[1.0, 1.0]]
    logp.grad = None
    ex = LossExtras(LossParamsConfig(simko_top_k=1, simko_entropy_quantile=0.0), torch.tensor([[2.0, 2.0]]) +
                    torch.tensor([[0.0, -1.0]]), top)
    loss, _ = per_token_policy_loss(logp, logp.detach(), -torch.ones(1, 2), 0.2, 0.2, None, name="simko",
                                    response_mask=torch.ones(1, 2), extras=ex)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([1.1, 1.0])


def test_simko_needs_the_forward_statistics():
    with pytest.raises(ValueError, match="simko needs the forward's top-K log-probs and entropy"):
        per_token_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.2, 0.2, None, name="simko")


# ------------------------------------------------------------------------------ every rival, composition


def _extras_for(name, logits, targets, ent):
    if name != "simko":
        return None, None
    logp, top = _simko_graph(logits, targets, 3)
    return LossExtras(LossParamsConfig(simko_top_k=3), ent, top), TokenStats(top_log_probs=top)


def _cfg(name, **kw):
    settings = {"dppo_tv": dict(clip_low=0.15, clip_high=0.15), "dppo_kl": dict(clip_low=0.05, clip_high=0.05),
                "sapo": dict(dual_clip=None), "simko": dict(dual_clip=None, clip_high=0.2), "aspo": dict(dual_clip=3.0)}
    return AlgorithmConfig(policy_loss=name, kl_coef=0.0, **{**settings.get(name, {}), **kw})


def _objective_grad(name, adv, phase, seed=6, **kw):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 6, 10, generator=g) * 1.5).requires_grad_(True)
    targets = torch.randint(0, 10, (3, 6), generator=g)
    logp, _ = _simko_graph(logits, targets, 3)
    old = logp.detach() + 0.05 * torch.randn(3, 6, generator=g)
    ent = torch.rand(3, 6, generator=g)
    _, dist = _extras_for(name, logits, targets, ent)
    mask = torch.ones(3, 6)
    mask[2, 4:] = 0
    loss, _ = _objective(logp, old, adv * mask, mask, phase, _cfg(name, **kw), entropy=ent, dist=dist)
    loss.backward()
    return logits.grad, old, mask


@pytest.mark.parametrize("name", RIVALS)
def test_a_lopti_phase_leaves_the_other_phases_tokens_without_gradient(name):
    adv = torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 6).clone()
    _, old, mask = _objective_grad(name, adv, torch.ones(3, 6))
    low = (torch.exp(old) < 0.1) & mask.bool()
    assert low.any() and (mask.bool() & ~low).any()
    grad, _, _ = _objective_grad(name, adv, low.float())
    high = mask.bool() & ~low
    # a token's logits get gradient only from its own loss: the high phase's positions have none
    assert torch.equal(grad[high], torch.zeros_like(grad[high]))
    assert (grad[low].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("name", RIVALS)
def test_ar_weights_scale_each_tokens_gradient(name):
    """AR multiplies A_t by a positive weight: every rival's token gradient scales by it, off-policy too."""
    adv = torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 6).clone()
    w = torch.linspace(0.7, 1.0, 18).view(3, 6)
    plain, _, mask = _objective_grad(name, adv, torch.ones(3, 6))
    weighted, _, _ = _objective_grad(name, adv * w, torch.ones(3, 6))
    torch.testing.assert_close(weighted, plain * w.unsqueeze(-1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", RIVALS)
def test_edge_cases_empty_mask_and_extreme_probabilities(name):
    extras = LossExtras(LossParamsConfig(simko_top_k=1), torch.ones(2, 3), torch.zeros(2, 3, 1))
    zeros = torch.zeros(2, 3)
    cfg = _cfg(name)
    # an empty mask: zero loss, zero gradient, finite metrics
    logp = torch.log(torch.full((2, 3), 0.5)).requires_grad_(True)
    loss, m = _objective(logp, logp.detach(), torch.ones(2, 3), zeros, zeros, cfg, entropy=torch.ones(2, 3),
                         dist=TokenStats(top_log_probs=torch.zeros(2, 3, 1)))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, zeros) and all(math.isfinite(v) for v in m.values())
    # p near 0 and 1, a ratio of 20 and of 1/20: finite values and gradients
    p_old = torch.tensor([[1e-9, 0.999999, 1e-4], [0.5, 0.05, 0.999]])
    ratio = torch.tensor([[20.0, 1.0, 20.0], [1 / 20, 20.0, 1.0]])
    old = torch.log(p_old)
    lp = torch.minimum(old + torch.log(ratio), torch.full_like(old, -1e-7)).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0], [1.0, -1.0, 1.0]])
    loss, _ = per_token_policy_loss(lp, old, adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip, name=name,
                                    response_mask=torch.ones(2, 3), extras=extras)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(lp.grad).all()


def test_the_rivals_settings_are_refused_where_they_cannot_apply():
    def check(**algo):
        cfg = RunConfig()
        for k, v in algo.items():
            setattr(cfg.algorithm, k, v)
        validate_run(cfg)

    for name in ("sapo", "simko"):
        with pytest.raises(ConfigError, match=f"algorithm.dual_clip=10.0: algorithm.policy_loss={name} has no dual-clip"):
            check(policy_loss=name)
    for name in ("dppo_tv", "sapo"):
        with pytest.raises(ConfigError, match=f"archer cannot apply to algorithm.policy_loss={name}"):
            check(policy_loss=name, dual_clip=None, token_method=TokenMethodConfig(name="archer"))
    for name in ("dppo_tv", "dppo_kl", "ce_gppo", "aspo"):  # a dual-clip is read (DPPO: truncation; ASPO: soft)
        check(policy_loss=name)
    check(policy_loss="aspo", token_method=TokenMethodConfig(name="archer"))
    check(policy_loss="simko", dual_clip=None, ar_alpha=0.3)
    assert set(RIVALS) <= set(POLICY_LOSSES.names())


@pytest.mark.parametrize("name,mode", [("dppo_tv", "tv"), ("dppo_kl", "kl")])
def test_dppo_engine_anchor_is_stable_rls_default(name, mode):
    """``loss_params.dppo_anchor=engine``: mask and detached ratio from the engine's log-probs (Stable-RL's
    dppo_binary_*), not pi_old; with engine = pi_old it is the default anchor bit for bit."""
    g = torch.Generator().manual_seed(2)
    old = torch.log(torch.rand(5, 8, generator=g).clamp(1e-4, 1 - 1e-4))
    engine = torch.minimum(old + 0.3 * torch.randn(5, 8, generator=g), torch.full_like(old, -1e-6))
    logp = torch.minimum(old + 0.5 * torch.randn(5, 8, generator=g), torch.full_like(old, -1e-6))
    adv = torch.randn(5, 8, generator=g)
    mask = torch.ones(5, 8)
    delta = (0.15, 0.15) if mode == "tv" else (0.05, 0.05)
    loss_fn = POLICY_LOSSES.get(name)
    engine_x = LossExtras(LossParamsConfig(dppo_anchor="engine"), behaviour_log_probs=engine)

    def ours(lp, extras):
        return _token_mean(loss_fn(lp, old, adv, mask, *delta, None, extras=extras)[0], mask)

    def stable_rl(lp):  # -A * sg(rho vs the engine) * logpi * valid(engine anchor)
        rho = torch.exp((lp - engine).clamp(-20, 20)).detach()
        return _token_mean(-adv * rho * lp * stable_rl_mask(mode, engine, lp.detach(), adv, *delta), mask)

    e_loss, e_grad = _grad(lambda lp: ours(lp, engine_x), logp)
    s_loss, s_grad = _grad(stable_rl, logp)
    torch.testing.assert_close(e_grad, s_grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(e_loss, s_loss, rtol=1e-6, atol=1e-6)
    _, o_grad = _grad(lambda lp: ours(lp, None), logp)
    assert not torch.allclose(e_grad, o_grad)  # the anchor matters here
    same = LossExtras(LossParamsConfig(dppo_anchor="engine"), behaviour_log_probs=old)
    _, same_grad = _grad(lambda lp: ours(lp, same), logp)
    assert torch.equal(same_grad, o_grad)
    with pytest.raises(ValueError, match="dppo_anchor=engine needs the engine's log-probs"):
        ours(logp, LossExtras(LossParamsConfig(dppo_anchor="engine")))


def test_the_engine_anchor_needs_a_dppo_loss_and_the_engine_logprobs():
    from dataclasses import replace

    from arlopti.config import AlgorithmConfig, RolloutConfig

    algo = AlgorithmConfig(policy_loss="dppo_tv", loss_params=LossParamsConfig(dppo_anchor="engine"))
    validate_run(RunConfig(algorithm=algo))
    with pytest.raises(ConfigError, match="dppo_anchor=engine needs the engine's log-probs: set rollout.return_logprobs"):
        validate_run(RunConfig(algorithm=algo, rollout=RolloutConfig(return_logprobs=False)))
    with pytest.raises(ConfigError, match="dppo_anchor=engine is read by the dppo_\\* losses only"):
        validate_run(RunConfig(algorithm=replace(algo, policy_loss="ppo_clip")))


# ------------------------------------------------------------------------ SAPO's empty rows (issue 45 §4)
# Three responses, the third with no valid token (e.g. algorithm.dapo.mask_truncated masked it whole), on
# policy (rho = 1: l_t = -(2 / tau) A_t and d l_t / d logp_t = -A_t). Row means: -2 (A = 1, tau 1, two tokens)
# and 2 / 1.05 (A = -1, tau 1.05, one token). verl's agg_loss without global_batch_size averages the S = 2
# non-empty rows; TRL's (...).mean() all B = 3.
_ROWS_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
_ROWS_ADV = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
_ROW_MEANS = (-2.0, 2.0 / 1.05)


def _sapo_cfg(rows: str):
    return _cfg("sapo", loss_agg="seq-mean-token-mean",
                loss_params=LossParamsConfig(sapo_tau_pos=1.0, sapo_tau_neg=1.05, sapo_empty_rows=rows))


def _sapo_rows(rows: str, scale=None):
    old = torch.log(torch.tensor([[0.3, 0.6, 0.5], [0.2, 0.5, 0.5], [0.4, 0.5, 0.5]]))
    logp = old.clone().requires_grad_(True)
    loss, _ = _objective(logp, old, _ROWS_ADV, _ROWS_MASK, _ROWS_MASK, _sapo_cfg(rows), scale=scale)
    loss.backward()
    return loss.item(), logp.grad


@pytest.mark.parametrize("rows, count", [("skip", 2), ("zero", 3)])
def test_sapo_empty_rows_by_hand(rows, count):
    loss, grad = _sapo_rows(rows)
    assert loss == pytest.approx(sum(_ROW_MEANS) / count, abs=1e-6)
    want = torch.tensor([[-0.5, -0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]) / count  # -A / row length / count
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)


def test_sapo_empty_rows_zero_is_skip_times_s_over_b_and_equals_trl():
    (skip, g_skip), (zero, g_zero) = _sapo_rows("skip"), _sapo_rows("zero")
    assert zero == pytest.approx(skip * 2 / 3, abs=1e-7) and skip == pytest.approx(-0.0476190, abs=1e-6)
    torch.testing.assert_close(g_zero, g_skip * 2 / 3)
    old = torch.log(torch.tensor([[0.3, 0.6, 0.5], [0.2, 0.5, 0.5], [0.4, 0.5, 0.5]]))
    trl = verl_sapo(old, old, _ROWS_ADV, _ROWS_MASK, 1.0, 1.05, clamp=False)  # TRL's sapo branch, per token
    trl = ((trl * _ROWS_MASK).sum(-1) / _ROWS_MASK.sum(-1).clamp(min=1.0)).mean()  # its GRPO normaliser
    assert zero == pytest.approx(trl.item(), abs=1e-7)
    # the learner's scale (mini-batch scope) overrides the row count in both
    assert _sapo_rows("zero", scale=6.0)[0] == pytest.approx(sum(_ROW_MEANS) / 6, abs=1e-6)


def test_the_row_count_of_the_learners_normaliser(tiny_tokenizer):
    """``token_mean_scope=minibatch`` (the default): the learner's normaliser counts S or B rows."""
    from types import SimpleNamespace

    from arlopti.config import AlgorithmConfig, SizesConfig
    from arlopti.learner.module import GRPOModule

    exp = SimpleNamespace(response_mask=_ROWS_MASK, input_ids=torch.zeros(3, 3, dtype=torch.long))
    for rows, count in (("skip", 2.0), ("zero", 3.0)):
        algo = AlgorithmConfig(policy_loss="sapo", dual_clip=None, loss_agg="seq-mean-token-mean",
                               loss_params=LossParamsConfig(sapo_empty_rows=rows))
        cfg = RunConfig(algorithm=algo, sizes=SizesConfig(prompts_per_step=1, group_size=3, mini_batch_size=3,
                                                          micro_batch_size=3, logprob_micro_batch_size=3))
        module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
        assert module._loss_count(exp, "all", [0, 1, 2], None) == count
    other = AlgorithmConfig(policy_loss="gspo", dual_clip=None, loss_agg="seq-mean-token-mean",
                            loss_params=LossParamsConfig(sapo_empty_rows="zero"))
    from arlopti.plugins.rival_losses import empty_rows

    assert empty_rows(other) == "skip"  # another loss never reads it (and the config refuses it: below)


def test_sapo_empty_rows_zero_needs_sapo_and_a_row_mean():
    from dataclasses import replace

    from arlopti.config import AlgorithmConfig

    algo = AlgorithmConfig(policy_loss="sapo", dual_clip=None, loss_agg="seq-mean-token-mean",
                           loss_params=LossParamsConfig(sapo_empty_rows="zero"))
    validate_run(RunConfig(algorithm=algo))
    for bad in (replace(algo, policy_loss="ppo_clip", dual_clip=10.0), replace(algo, loss_agg="token-mean")):
        with pytest.raises(ConfigError, match=r"algorithm\.loss_params\.sapo_empty_rows=zero is how SAPO's mean "
                                              r"over responses counts an empty one.*experiment=kk_sapo"):
            validate_run(RunConfig(algorithm=bad))
    with pytest.raises(ConfigError, match="sapo_empty_rows"):
        validate_run(RunConfig(algorithm=replace(algo, loss_params=LossParamsConfig(sapo_empty_rows="trl"))))
