"""The gradient identities the paper's methods rest on.

(i)   AR: ∂loss/∂logπ_t under AR equals [α·p_old,t + 1 − α] × GRPO's, token by token.
(ii)  Lopti: at fixed parameters, loss(low phase) + loss(high phase) = the unsplit loss.
(iii) Lopti phase 1: high-group tokens get exactly zero gradient (policy and KL terms).
"""

import dataclasses

import pytest

import torch

from arlopti.algorithms import advantage_reweight, ar_weights, grpo_objective, lopti_masks
from arlopti.config import AlgorithmConfig

torch.manual_seed(0)
B, T = 6, 10
MASK = (torch.rand(B, T) > 0.2).float()
OLD = torch.log(torch.rand(B, T).clamp(0.02, 1.0)) * MASK
ADV = torch.randn(B, 1).expand(B, T) * MASK
REF = OLD + 0.1 * torch.randn(B, T)
# Current log-probs near the old ones, some far enough to trigger clipping and dual-clip.
LOGP = (OLD + 0.3 * torch.randn(B, T)).clamp(max=0)
CFG = AlgorithmConfig(kl_coef=0.01, entropy_coef=0.0)


def _grad(adv, phase_mask, cfg=CFG, normalize="all"):
    logp = LOGP.clone().requires_grad_()
    cfg = dataclasses.replace(cfg, lopti=dataclasses.replace(cfg.lopti, normalize=normalize))
    loss, _ = grpo_objective(logp, OLD, adv, MASK, phase_mask, cfg, ref_log_probs=REF)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("alpha", [0.1, 0.3, 1.0])
def test_ar_scales_each_token_gradient_exactly(alpha):
    cfg = AlgorithmConfig(kl_coef=0.0)  # the KL gradient does not involve A
    _, g_grpo = _grad(ADV, MASK, cfg)
    _, g_ar = _grad(advantage_reweight(ADV, OLD, alpha), MASK, cfg)
    w = ar_weights(OLD, alpha)
    torch.testing.assert_close(g_ar, w * g_grpo, rtol=1e-5, atol=1e-8)
    assert (g_grpo != 0).any()


def test_lopti_phase_losses_sum_to_unsplit_loss():
    low, high = lopti_masks(OLD, MASK, 0.5)
    assert low.any() and high.any()
    full, g_full = _grad(ADV, MASK)
    l_low, g_low = _grad(ADV, low)
    l_high, g_high = _grad(ADV, high)
    torch.testing.assert_close(l_low + l_high, full, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g_low + g_high, g_full, rtol=1e-5, atol=1e-8)


def test_lopti_phase_one_gives_high_tokens_zero_gradient():
    low, high = lopti_masks(OLD, MASK, 0.5)
    _, g_low = _grad(ADV, low)
    assert torch.all(g_low[high] == 0)
    assert (g_low[low] != 0).any()


def test_phase_normalisation_option_uses_the_phase_token_count():
    low, _ = lopti_masks(OLD, MASK, 0.5)
    cfg = AlgorithmConfig(kl_coef=0.0, clip_low=10.0, clip_high=10.0, dual_clip=None)  # no clipping
    l_all, _ = _grad(ADV, low, cfg, normalize="all")
    l_phase, _ = _grad(ADV, low, cfg, normalize="phase")
    torch.testing.assert_close(l_phase, l_all * MASK.sum() / low.sum(), rtol=1e-5, atol=1e-7)
