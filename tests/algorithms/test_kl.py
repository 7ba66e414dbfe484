import math

import pytest
import torch

from arlopti.algorithms import kl_penalty


def test_estimators_hand_computed():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])  # d = ref - logp = -1
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1))
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(math.exp(-1))


def test_low_var_kl_clamps():
    logp = torch.tensor([0.0, 0.0])
    ref = torch.tensor([10.0, -10.0])  # d clamped to +5 / -5
    out = kl_penalty(logp, ref, "low_var_kl")
    assert out[0].item() == pytest.approx(10.0)  # e^5 - 6 = 142.4, clamped to 10
    assert out[1].item() == pytest.approx(math.exp(-5) + 4)
    assert kl_penalty(logp, ref, "k3")[0].item() == pytest.approx(math.exp(10) - 11)


def test_zero_when_equal_and_unknown_name():
    x = torch.randn(3, 4)
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert torch.allclose(kl_penalty(x, x, kind), torch.zeros(3, 4))
    with pytest.raises(KeyError, match="KL estimator"):
        kl_penalty(x, x, "k9")
