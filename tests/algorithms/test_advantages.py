import math

import pytest
import torch

from arlopti.algorithms import ADVANTAGE_ESTIMATORS, broadcast_to_tokens, grpo_advantages, rloo_advantages
from arlopti.algorithms.advantages import zero_std_group_fraction

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0])
G = torch.tensor([7, 7, 7, 7, 2, 2])  # ids need not be contiguous or ordered


def test_grpo_uses_unbiased_std_and_eps_on_std():
    a = grpo_advantages(R, G, eps=1e-6)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased: sum of squared deviations / (n - 1)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (std + 1e-6)
    torch.testing.assert_close(a, expected, rtol=0, atol=1e-6)


def test_drgrpo_is_mean_centred_only():
    torch.testing.assert_close(grpo_advantages(R, G, norm_by_std=False),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]))


def test_rloo_leave_one_out():
    a = rloo_advantages(R, G)
    torch.testing.assert_close(a, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0]))


def test_group_of_one_has_mean_zero_std_one():
    a = grpo_advantages(torch.tensor([2.0, 5.0, 1.0]), torch.tensor([0, 1, 1]), eps=1e-6)
    assert a[0].item() == pytest.approx(2.0 / (1 + 1e-6))
    assert a[1].item() == pytest.approx(-a[2].item())


def test_registry_names_and_errors():
    assert set(ADVANTAGE_ESTIMATORS.names()) >= {"grpo", "drgrpo", "rloo"}
    with pytest.raises(KeyError, match="unknown advantage estimator 'nope'"):
        ADVANTAGE_ESTIMATORS.get("nope")


def test_broadcast_is_zero_on_padding():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_zero_std_fraction():
    assert zero_std_group_fraction(R, G) == pytest.approx(0.5)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="must be equal 1-D"):
        grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
