"""Clip-Cov against a restatement of verl's ``compute_policy_loss_clip_cov``
(``verl/trainer/ppo/core_algos.py``), on a batch with a ratio-20 token at A = -1 (issue 24, §1).

verl's function has no dual-clip: its token loss is ``max(-A·ρ, -A·clip(ρ, 1-ε_low, 1+ε_high))·corr``,
so at A = -1 and ρ = 20 the token's loss is 20 and its gradient w.r.t. logπ is ρ = 20 (20/N after the
token-mean). ``kk_clip_cov`` therefore sets ``algorithm.dual_clip: null``; with the default dual-clip
10 the loss would be capped at 10 and the gradient would be 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import grpo_objective
from arlopti.config import AlgorithmConfig, TokenMethodConfig
from arlopti.plugins.shaping import Forward, shaping_for

# one response, N = 4 valid tokens; token 0: A = -1, ratio 20; the others on-policy
OLD = torch.tensor([[-3.0, -0.01, -2.0, -1.0]])  # cov = [-1.12, 1.12, -1.88, 0.37]: token 1 in (1, 5)
LOGP = OLD + torch.tensor([[math.log(20.0), 0.0, 0.0, 0.0]])
ADV = torch.tensor([[-1.0, 2.0, 2.0, -1.0]])
MASK = torch.ones(1, 4)
CLIP = (0.2, 0.24)


def verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high,
                  clip_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0):
    """verl's Clip-Cov loss, restated (token-mean). Returns (loss, candidate count); the random draw
    is replaced by 'all candidates', which is verl's draw whenever there are at most k of them."""
    ratio = torch.exp(log_prob - old_log_prob)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped_by_origin = (losses2 > losses1) & (response_mask > 0)
    n = response_mask.sum()
    adv_mean = (advantages * response_mask).sum() / n
    lp_mean = (log_prob.detach() * response_mask).sum() / n
    cov = (advantages - adv_mean) * (log_prob.detach() - lp_mean)
    cov = cov.masked_fill(response_mask == 0, -math.inf).masked_fill(clipped_by_origin, -math.inf)
    k = max(int(clip_ratio * float(n)), 1)
    candidates = (cov < clip_cov_ub) & (cov > clip_cov_lb) & (response_mask > 0)
    assert int(candidates.sum()) <= k, "the test batch must make verl's random draw deterministic"
    corr = (~candidates).to(advantages.dtype)
    token_loss = torch.maximum(losses1, losses2) * corr
    return (token_loss * response_mask).sum() / n, int(candidates.sum())


def _ours(dual_clip):
    lp = LOGP.clone().requires_grad_(True)
    algo = AlgorithmConfig(kl_coef=0.0, clip_low=CLIP[0], clip_high=CLIP[1], dual_clip=dual_clip,
                           token_method=TokenMethodConfig(name="clip_cov"))
    shaping = shaping_for(algo, lp, OLD, ADV, MASK, MASK, Forward())
    loss, metrics = grpo_objective(lp, OLD, ADV, MASK, MASK, algo, shaping=shaping)
    loss.backward()
    return loss.detach(), lp.grad


def test_clip_cov_without_dual_clip_matches_verl_on_a_ratio_20_token():
    lp = LOGP.clone().requires_grad_(True)
    ref_loss, n_cand = verl_clip_cov(OLD, lp, ADV, MASK, *CLIP)
    ref_loss.backward()
    assert n_cand == 1  # one token (not the ratio-20 one) is detached: the comparison covers the selection
    loss, grad = _ours(dual_clip=None)
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(grad, lp.grad, rtol=0, atol=2e-6)
    n = 4
    assert grad[0, 0].item() == pytest.approx(20.0 / n, rel=1e-5)  # the ratio-20 token: 20/N


def test_the_default_dual_clip_would_cap_that_token():
    _, grad = _ours(dual_clip=10.0)
    assert grad[0, 0].item() == 0.0  # loss capped at -A·c = 10: no gradient, unlike verl


@pytest.mark.parametrize("name", ["kk_clip_cov", "kk_clip_cov_lopti"])
def test_clip_cov_experiments_have_no_dual_clip(name, tmp_path):
    from helpers.compose import compose_train

    cfg = compose_train([f"experiment={name}", "debug=smoke"], tmp_path)
    assert cfg.algorithm.token_method.name == "clip_cov"
    assert cfg.algorithm.dual_clip is None
