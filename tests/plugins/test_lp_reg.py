"""Lp-Reg (arXiv 2510.03222) against a restatement of CarlanLark/Lp-Reg-dev's code: the min-p proxy
(``apply_min_p`` on the raw logits, then the temperature) from the fused pass, and
``compute_policy_loss_lp_reg`` in value and gradient; by hand; its edge cases (k <= 1 selects nothing, a
token the filter calls noise is left to PPO, p near 0 and near 1, a ratio of 20 with and without the
dual-clip, empty masks); and its compositions with AR and Lopti."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import grpo_objective
from arlopti.config import AlgorithmConfig
from arlopti.plugins.forward_needs import forward_stats
from arlopti.config import ConfigError, RunConfig, TokenMethodConfig, validate_run
from arlopti.ops.logprobs import token_logprobs
from arlopti.ops.tile_stats import TokenStats
from arlopti.plugins.shaping import Forward, shaping_for


def apply_min_p(logits, min_p):
    """Lp-Reg's ``apply_min_p`` (regular_type='minp', minp_soft=False), restated: on the raw logits."""
    probs = torch.softmax(logits, dim=-1)
    keep = probs >= min_p * probs.amax(-1, keepdim=True)
    return logits.masked_fill(~keep, -1e4)


def lp_reg_code(old_log_prob, log_prob, tgt_log_prob, advantages, response_mask, clip_low, clip_high,
                neg_k_percent, pos_k_percent=0.0, coef=1.0):
    """Lp-Reg's compute_policy_loss_lp_reg (token-mean), restated with its in-place index writes."""
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
    valid = (response_mask > 0).reshape(-1).nonzero(as_tuple=True)[0]
    seq_len = advantages.shape[1]
    flat_a, flat_lp = advantages.reshape(-1), log_prob.reshape(-1)

    def apply(idx):
        b, s = idx // seq_len, idx % seq_len
        keep = log_prob[b, s].detach() < tgt_log_prob[b, s]
        b, s = b[keep], s[keep]
        if len(b) == 0:
            return
        kl = tgt_log_prob[b, s] - log_prob[b, s]
        target_kl = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)  # its kl_penalty("low_var_kl")
        pg_losses[b, s] = -advantages[b, s] * ratio[b, s] + coef * target_kl

    for sign, share in ((1, pos_k_percent), (-1, neg_k_percent)):
        idx = valid[flat_a[valid] > 0] if sign > 0 else valid[flat_a[valid] < 0]
        k = max(1, int(len(idx) * share))
        if len(idx) > 0 and k > 1:
            apply(idx[flat_lp[idx].detach().topk(k=k, largest=False).indices])
    return (pg_losses * response_mask).sum() / response_mask.sum()


def _batch(seed=0, b=3, t=8, v=20, temperature=0.7):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(b * t, v, generator=g) * 3  # raw logits of the current policy, one row per position
    targets = torch.randint(0, v, (b * t,), generator=g)
    return raw, targets, temperature


def test_the_fused_proxy_is_lp_regs_min_p_on_the_raw_logits():
    raw, targets, temp = _batch()
    algo = AlgorithmConfig(token_method=TokenMethodConfig(name="lp_reg", lp_reg_min_p=0.1))
    req = forward_stats(algo, temp)
    assert req.min_p_log == pytest.approx(math.log(0.1) / temp)
    # identity head: the hidden states are the raw logits
    _, _, st = token_logprobs(raw, torch.eye(raw.shape[1]), targets, temp, impl="fused", vocab_chunk=7, stats=req)
    ref = torch.log_softmax(apply_min_p(raw, 0.1) / temp, -1).gather(1, targets[:, None])[:, 0]
    kept = ref > -1e3  # Lp-Reg's -1e4 / T marks a filtered token; ours is -inf
    assert 0 < int(kept.sum()) < len(targets)
    assert torch.equal(torch.isfinite(st.min_p_log_prob), kept)
    torch.testing.assert_close(st.min_p_log_prob[kept], ref[kept], rtol=1e-5, atol=1e-5)


def _loss_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 10, generator=g) * 6
    logp = old + 0.4 * torch.randn(4, 10, generator=g)
    adv = torch.tensor([[1.0], [-1.0], [-0.5], [0.8]]).expand(4, 10).clone()
    mask = torch.ones(4, 10)
    mask[3, 7:] = 0
    proxy = logp.detach() + torch.rand(4, 10, generator=g) * 1.5 - 0.3  # mostly above logp: would be raised
    proxy[1, 2] = -math.inf  # a noise token: the filter dropped it
    return old, logp, adv * mask, mask, proxy


def _ours(old, logp, adv, mask, proxy, phase=None, dual_clip=None, **tm):
    cfg = AlgorithmConfig(kl_coef=0.0, dual_clip=dual_clip, clip_low=0.2, clip_high=0.28,
                          token_method=TokenMethodConfig(name="lp_reg", **tm))
    phase = mask if phase is None else phase
    shaping = shaping_for(cfg, logp, old, adv, mask, phase, Forward(dist=TokenStats(min_p_log_prob=proxy)))
    return grpo_objective(logp, old, adv, mask, phase, cfg, shaping=shaping)[0]


@pytest.mark.parametrize("neg,pos", [(0.3, 0.0), (0.5, 0.4), (0.05, 0.0)])
def test_lp_reg_equals_lp_reg_code_in_value_and_gradient(neg, pos):
    old, logp0, adv, mask, proxy = _loss_inputs()
    results = []
    for fn in (lambda lp: lp_reg_code(old, lp, proxy, adv, mask, 0.2, 0.28, neg, pos),
               lambda lp: _ours(old, lp, adv, mask, proxy, lp_reg_neg_share=neg, lp_reg_pos_share=pos)):
        lp = logp0.clone().requires_grad_(True)
        loss = fn(lp)
        loss.backward()
        results.append((loss.detach(), lp.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-6, atol=1e-7)
    plain = logp0.clone().requires_grad_(True)
    _ours(old, plain, adv, mask, proxy, lp_reg_neg_share=0.0).backward()  # k <= 1: nothing selected
    changed = not torch.equal(results[1][1], plain.grad)
    assert changed == (neg != 0.05)  # 0.05 of 19 negatives: k = max(1, 0) = 1, not applied (Lp-Reg's k > 1)


def test_lp_reg_by_hand_one_regularised_token():
    # two A < 0 tokens, share 1: k = 2; token 0 below its proxy (p 0.1 < p' 0.3), token 1 above (0.5 > 0.4)
    logp = torch.log(torch.tensor([[0.1, 0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.2, 0.5]]))  # token 0: ratio 0.5 < 1 - 0.2, PPO would clip it
    proxy = torch.log(torch.tensor([[0.3, 0.4]]))
    adv, mask = -torch.ones(1, 2), torch.ones(1, 2)
    loss = _ours(old, logp, adv, mask, proxy, lp_reg_neg_share=1.0, lp_reg_coef=1.0)
    loss.backward()
    d = math.log(0.3 / 0.1)
    # token 0: the unclipped -A r = 0.5 plus the KL e^d - d - 1 = 3 - ln 3 - 1; token 1: PPO at ratio 1, -A = 1
    assert loss.item() == pytest.approx((0.5 + (math.exp(d) - d - 1) + 1.0) / 2, rel=1e-5)
    # gradients: token 0, -A r = 0.5 and the KL's 1 - p'/p = 1 - 3 = -2 (raised toward the proxy); token 1, -A = 1
    assert logp.grad[0].tolist() == pytest.approx([(0.5 - 2.0) / 2, 0.5], rel=1e-5)


def test_lp_reg_within_a_lopti_phase_and_with_ar():
    old, logp0, adv, mask, proxy = _loss_inputs()
    low = (torch.exp(old) < 0.05) & mask.bool()
    lp = logp0.clone().requires_grad_(True)
    _ours(old, lp, adv, mask, proxy, phase=low.float(), lp_reg_neg_share=0.5).backward()
    assert torch.equal(lp.grad[mask.bool() & ~low], torch.zeros(int((mask.bool() & ~low).sum())))
    # AR scales A; the selection (by logp and proxy) and the KL term do not depend on |A|
    grads = []
    for w in (1.0, 0.8):
        lp = logp0.clone().requires_grad_(True)
        _ours(old, lp, adv * w, mask, proxy, lp_reg_neg_share=0.5, lp_reg_coef=0.0).backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[1], grads[0] * 0.8)


def test_lp_reg_needs_its_proxy_and_ppo_clip():
    old, logp, adv, mask, _ = _loss_inputs()
    with pytest.raises(ValueError, match="lp_reg needs the forward's min_p_log_prob"):
        shaping_for(AlgorithmConfig(token_method=TokenMethodConfig(name="lp_reg")), logp, old, adv, mask, mask,
                    Forward())
    cfg = RunConfig()
    cfg.algorithm.token_method.name = "lp_reg"
    cfg.algorithm.policy_loss = "cispo"
    cfg.algorithm.dual_clip = None
    with pytest.raises(ConfigError, match="lp_reg needs algorithm.policy_loss=ppo_clip"):
        validate_run(cfg)


def _value_and_grad(fn, logp):
    lp = logp.clone().requires_grad_(True)
    loss = fn(lp)
    loss.backward()
    return loss.item(), lp.grad[0].tolist()


def test_lp_reg_p_near_zero_the_kl_saturates_at_its_clamp():
    # two A < 0 tokens at p = 1e-6 (ratio 1), share 1: k = 2, both below their proxies. Token 0's proxy
    # 1e-3: d = ln 1000, e^d - d - 1 = 992 clamps to 10 (Lp-Reg's kl_penalty clamp) and pulls no more;
    # token 1's proxy 4e-6: d = ln 4, KL = 3 - ln 4, gradient 1 - e^d = -3. The unclipped -A r = 1 each.
    logp = torch.log(torch.tensor([[1e-6, 1e-6]]))
    proxy = torch.log(torch.tensor([[1e-3, 4e-6]]))
    adv, mask = -torch.ones(1, 2), torch.ones(1, 2)
    loss, grad = _value_and_grad(lambda lp: _ours(logp, lp, adv, mask, proxy, lp_reg_neg_share=1.0), logp)
    assert loss == pytest.approx((1 + 10 + 1 + (3 - math.log(4))) / 2, rel=1e-5)
    assert grad == pytest.approx([(1 + 0) / 2, (1 - 3) / 2], rel=1e-4)
    peer = _value_and_grad(lambda lp: lp_reg_code(logp, lp, proxy, adv, mask, 0.2, 0.28, 1.0), logp)
    assert peer[0] == pytest.approx(loss, rel=1e-6) and peer[1] == pytest.approx(grad, rel=1e-6)


def test_lp_reg_p_near_one_a_tiny_pull_and_p_equal_to_its_proxy_is_left_to_ppo():
    # three A < 0 tokens at ratio 1, proxy p' = 1 each (the filter kept only them); share 1: k = 3.
    # p = 0.99 and 0.999 lie below p' = 1: KL e^d - d - 1 with e^d = 1/p, gradient 1 - 1/p;
    # p = 1 equals its proxy: not below it, so not regularised (PPO's -A r = 1, gradient 1).
    p = torch.tensor([[0.99, 0.999, 1.0]])
    logp, proxy = torch.log(p), torch.zeros(1, 3)
    adv, mask = -torch.ones(1, 3), torch.ones(1, 3)
    loss, grad = _value_and_grad(lambda lp: _ours(logp, lp, adv, mask, proxy, lp_reg_neg_share=1.0), logp)
    kl = [1 / q + math.log(q) - 1 for q in (0.99, 0.999)]
    assert loss == pytest.approx((3 + sum(kl)) / 3, rel=1e-6)
    assert grad == pytest.approx([(1 + 1 - 1 / 0.99) / 3, (1 + 1 - 1 / 0.999) / 3, 1 / 3], rel=1e-5)


def test_lp_reg_at_a_ratio_of_20():
    # ratio 20 everywhere: p_old = 0.001, p = 0.02. Token 0 (A = +1, proxy 0.05, chosen by pos_share):
    # no clip, -A r = -20, plus KL at e^d = 2.5 (gradient 1 - 2.5); token 1 (A = +1, proxy 0.01 < p: not
    # chosen): PPO clips at 1 + 0.28, no gradient; token 2 (A = -1, the only negative: k = 1, not applied):
    # PPO's -A r = 20, gradient 20 (no dual-clip here).
    old, logp = torch.log(torch.full((1, 3), 0.001)), torch.log(torch.full((1, 3), 0.02))
    proxy = torch.log(torch.tensor([[0.05, 0.01, 0.05]]))
    adv, mask = torch.tensor([[1.0, 1.0, -1.0]]), torch.ones(1, 3)
    shares = {"lp_reg_neg_share": 1.0, "lp_reg_pos_share": 1.0}
    loss, grad = _value_and_grad(lambda lp: _ours(old, lp, adv, mask, proxy, **shares), logp)
    kl = 2.5 - math.log(2.5) - 1
    assert loss == pytest.approx((-20 + kl - 1.28 + 20) / 3, rel=1e-5)
    assert grad == pytest.approx([(-20 + 1 - 2.5) / 3, 0.0, 20 / 3], rel=1e-5, abs=1e-6)
    peer = _value_and_grad(lambda lp: lp_reg_code(old, lp, proxy, adv, mask, 0.2, 0.28, 1.0, 1.0), logp)
    assert peer[0] == pytest.approx(loss, rel=1e-6) and peer[1] == pytest.approx(grad, rel=1e-6, abs=1e-6)


def test_lp_reg_at_a_ratio_of_20_the_dual_clip_still_caps_its_negative_tokens():
    # two chosen A = -1 tokens at ratio 20 (proxies 0.05, 0.04): the clip is lifted (-A r = 20) but the
    # dual-clip 10 caps it at -A c = 10, whose gradient is 0: only the KL's 1 - e^d (-1.5, -1) remains.
    # Lp-Reg's loss has no dual-clip (the deviation its docstring states; kk_lp_reg sets none).
    old, logp = torch.log(torch.full((1, 2), 0.001)), torch.log(torch.full((1, 2), 0.02))
    proxy = torch.log(torch.tensor([[0.05, 0.04]]))
    adv, mask = -torch.ones(1, 2), torch.ones(1, 2)
    loss, grad = _value_and_grad(lambda lp: _ours(old, lp, adv, mask, proxy, dual_clip=10.0,
                                                  lp_reg_neg_share=1.0), logp)
    kl = [e - math.log(e) - 1 for e in (2.5, 2.0)]
    assert loss == pytest.approx((10 + kl[0] + 10 + kl[1]) / 2, rel=1e-5)
    assert grad == pytest.approx([-1.5 / 2, -1.0 / 2], rel=1e-5)


def test_lp_reg_with_empty_masks_selects_nothing_and_gives_zero():
    from arlopti.plugins.token_methods import lp_reg_selection, make_context

    old, logp0, adv, _, proxy = _loss_inputs()
    none = torch.zeros(4, 10)
    ctx = make_context(logp0, old, adv, none, none)
    assert not lp_reg_selection(ctx, -1, 1.0).any() and not lp_reg_selection(ctx, 1, 1.0).any()
    for mask, phase in ((none, none), (torch.ones(4, 10), none)):  # no valid token; an empty Lopti phase
        lp = logp0.clone().requires_grad_(True)
        loss = _ours(old, lp, adv * mask, mask, proxy, phase=phase, lp_reg_neg_share=1.0, lp_reg_pos_share=1.0)
        loss.backward()
        assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
