"""The core objective by hand: GRPO's terms, and each field of a precomputed ``Shaping`` acting as stated."""

import dataclasses

import pytest
import torch

from arlopti.algorithms import LossScale, Shaping, grpo_objective
from arlopti.config import AlgorithmConfig, TokenMethodConfig

OLD = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
CFG = AlgorithmConfig(kl_coef=0.0)


def _loss_and_grad(cfg=CFG, shaping=None, logp=OLD, scale=None):
    lp = logp.clone().requires_grad_()
    loss, m = grpo_objective(lp, OLD, ADV, MASK, MASK, cfg, scale=scale, shaping=shaping)
    loss.backward()
    return loss.detach(), lp.grad, m


def test_at_ratio_one_the_gradient_is_minus_a_over_the_token_count():
    loss, grad, m = _loss_and_grad()
    assert loss.item() == pytest.approx(-(3 - 2) / 5)
    torch.testing.assert_close(grad, -ADV * MASK / 5)
    assert m["tokens"] == 5 and m["loss"] == pytest.approx(loss.item())


def test_a_scale_replaces_the_token_count():
    _, grad, _ = _loss_and_grad(scale=LossScale(10.0))
    torch.testing.assert_close(grad, -ADV * MASK / 10)


def test_the_advantage_weight_and_the_loss_weight_scale_each_tokens_gradient():
    w = torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0]])
    _, by_adv, _ = _loss_and_grad(shaping=Shaping(adv_weight=w))
    _, by_loss, _ = _loss_and_grad(shaping=Shaping(loss_weight=w))
    torch.testing.assert_close(by_adv, -ADV * MASK * w / 5)
    torch.testing.assert_close(by_loss, -ADV * MASK * w / 5)  # the normaliser stays 5


def test_per_token_clip_bounds_replace_the_configured_ones():
    logp = OLD + torch.log(torch.tensor(1.3))  # ratio 1.3 everywhere
    high = torch.tensor([[0.24, 0.5, 0.24], [0.24, 0.24, 0.24]])
    _, grad, _ = _loss_and_grad(logp=logp, shaping=Shaping(clip_low=torch.full_like(MASK, 0.2), clip_high=high))
    # A > 0: clipped above 1.24 (no gradient) except where ε_high = 0.5; A < 0: never clipped above
    assert grad[0].tolist() == pytest.approx([0.0, -1.3 / 5, 0.0])
    assert grad[1, :2].tolist() == pytest.approx([1.3 / 5, 1.3 / 5])


def test_a_penalty_is_added_under_the_same_aggregation_and_weight():
    pen = Shaping(penalties=(lambda lp: 2.0 * lp,), loss_weight=torch.full_like(MASK, 0.5))
    plain, g0, _ = _loss_and_grad(shaping=Shaping(loss_weight=torch.full_like(MASK, 0.5)))
    loss, g1, _ = _loss_and_grad(shaping=pen)
    assert (loss - plain).item() == pytest.approx(float((2.0 * OLD * MASK * 0.5).sum() / 5))
    torch.testing.assert_close(g1 - g0, 2.0 * 0.5 * MASK / 5)


def test_the_kl_weight_scales_each_tokens_kl():
    ref = OLD - 0.5
    cfg = AlgorithmConfig(kl_coef=1.0, kl_in="loss")
    lp = OLD.clone().requires_grad_()
    full, _ = grpo_objective(lp, OLD, ADV * 0, MASK, MASK, cfg, ref_log_probs=ref)
    half, _ = grpo_objective(lp, OLD, ADV * 0, MASK, MASK, cfg, ref_log_probs=ref,
                             shaping=Shaping(kl_weight=torch.full_like(MASK, 0.5)))
    assert half.item() == pytest.approx(full.item() / 2)


@pytest.mark.parametrize("change", [{"token_method": TokenMethodConfig(name="kl_cov")}, {"policy_loss": "sapo"}])
def test_a_method_above_the_core_without_its_shaping_is_refused(change):
    cfg = dataclasses.replace(CFG, **change)
    with pytest.raises(ValueError, match="reads a shaping: pass shaping="):
        grpo_objective(OLD.clone(), OLD, ADV, MASK, MASK, cfg)
