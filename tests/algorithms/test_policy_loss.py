"""Policy loss, clipping, dual-clip and every aggregation mode against hand-computed values."""

import math

import pytest
import torch

from arlopti.algorithms import aggregate, policy_loss
from arlopti.algorithms.policy_loss import per_token_policy_loss

# Two sequences x 3 positions. Ratios are set through log_probs - old_log_probs.
RATIO = torch.tensor([[1.1, 1.5, 1.0], [0.5, 20.0, 1.0]])
ADV = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.full((2, 3), -1.0)
LOGP = OLD + torch.log(RATIO)
# Per token: -1.1 (unclipped), -1.24 (clip high: A>0, ratio>1.24), 0.8 (clip low: A<0, ratio<0.8),
# 10 (dual-clip: -A*ratio = 20 capped at -A*c = 10), 0 (A = 0).
PER_TOKEN = torch.tensor([[-1.1, -1.24, 0.0], [0.8, 10.0, 0.0]])


def test_per_token_values_and_indicators():
    loss, ind = per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, 10.0)
    torch.testing.assert_close(loss, PER_TOKEN, rtol=0, atol=1e-5)
    assert ind["clip_high"].tolist() == [[False, True, False], [False, False, False]]
    assert ind["clip_low"].tolist() == [[False, False, False], [True, False, False]]
    assert ind["clip_dual"].tolist() == [[False, False, False], [False, True, False]]


@pytest.mark.parametrize("agg,expected", [
    ("token-mean", (-1.1 - 1.24 + 0.8 + 10.0) / 5),
    ("seq-mean-token-mean", ((-1.1 - 1.24) / 2 + (0.8 + 10.0) / 3) / 2),
    ("seq-mean-token-sum", ((-1.1 - 1.24) + (0.8 + 10.0)) / 2),
    ("seq-mean-token-sum-norm", (-1.1 - 1.24 + 0.8 + 10.0) / (2 * 3)),
])
def test_aggregation_modes(agg, expected):
    loss, m = policy_loss(LOGP, OLD, ADV, MASK, 0.2, 0.24, 10.0, agg=agg)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert m["clip_frac_high"] == pytest.approx(1 / 5)
    assert m["clip_frac_low"] == pytest.approx(1 / 5)
    assert m["clip_frac_dual"] == pytest.approx(1 / 5)
    assert m["ratio_max"] == pytest.approx(20.0, rel=1e-5)


def test_scale_and_horizon_override_denominators():
    loss_tok = torch.ones(2, 3)
    assert aggregate(loss_tok, MASK, "token-mean", scale=10.0).item() == pytest.approx(0.5)
    assert aggregate(loss_tok, MASK, "seq-mean-token-sum", scale=4.0).item() == pytest.approx(5 / 4)
    assert aggregate(loss_tok, MASK, "seq-mean-token-sum-norm", horizon=5).item() == pytest.approx(5 / 10)


def test_no_dual_clip_when_disabled():
    loss, _ = per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, None)
    assert loss[1, 1].item() == pytest.approx(20.0, rel=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, 0.5)


def test_approx_kl_is_mean_old_minus_new():
    _, m = policy_loss(LOGP, OLD, ADV, MASK)
    expected = (-(torch.log(RATIO)) * MASK).sum() / MASK.sum()
    assert m["approx_kl"] == pytest.approx(expected.item(), abs=1e-6)


def test_gradient_is_minus_advantage_times_ratio_where_unclipped():
    logp = LOGP.clone().requires_grad_()
    loss, _ = policy_loss(logp, OLD, ADV, MASK, agg="token-mean")
    loss.backward()
    n = MASK.sum()
    expected = torch.tensor([[-1.1, 0.0, 0.0], [0.0, 0.0, 0.0]]) / n  # clipped tokens: no gradient
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)


def test_ppo_ratio_one_means_vanilla_pg():
    logp = torch.randn(3, 4).requires_grad_()
    adv = torch.randn(3, 4)
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(3, 4))
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 12)
    assert math.isclose(loss.item(), -adv.mean().item(), rel_tol=1e-5, abs_tol=1e-6)
