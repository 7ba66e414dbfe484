import math

import pytest
import torch

from arlopti.algorithms import advantage_reweight, ar_weights


def test_weights_hand_computed():
    old = torch.log(torch.tensor([[0.1, 0.9, 1.0]]))
    adv = torch.tensor([[2.0, -1.0, 0.0]])
    out = advantage_reweight(adv, old, alpha=0.3)
    torch.testing.assert_close(out, torch.tensor([[2.0 * 0.73, -0.97, 0.0]]))


@pytest.mark.parametrize("alpha", [0.0, 0.2, 1.0])
def test_weight_range_and_sign(alpha):
    old = torch.log(torch.rand(4, 5).clamp(1e-4, 1))
    w = ar_weights(old, alpha)
    assert torch.all(w >= 1 - alpha - 1e-6) and torch.all(w <= 1 + 1e-6)
    adv = torch.randn(4, 5)
    assert torch.equal(torch.sign(advantage_reweight(adv, old, alpha)), torch.sign(adv))


def test_alpha_zero_is_identity():
    adv = torch.randn(3, 4)
    torch.testing.assert_close(advantage_reweight(adv, torch.randn(3, 4).clamp(max=0), 0.0), adv)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, math.nan])
def test_alpha_out_of_range(alpha):
    with pytest.raises(ValueError, match="ar_alpha"):
        ar_weights(torch.zeros(1, 1), alpha)


def test_old_log_probs_are_detached():
    old = torch.log(torch.tensor([[0.5]])).requires_grad_()
    out = advantage_reweight(torch.tensor([[1.0]]), old, 0.5)
    assert not out.requires_grad
