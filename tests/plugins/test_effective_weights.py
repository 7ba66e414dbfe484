"""The effective weight per probability bucket (the live ``update/effective_weight/<b>``), by hand."""

import pytest
import torch

from arlopti.algorithms import Shaping, advantage_reweight
from arlopti.plugins.shaping import effective_weights

P_OLD = torch.tensor([[0.1, 0.2, 0.6, 0.9], [0.1, 0.9, 0.9, 0.5]])
OLD = torch.log(P_OLD)
BASE = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, 0.0, -2.0]])  # one zero advantage: no weight
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])  # padding at [1, 3]


def test_grpo_weighs_every_bucket_one():
    w = effective_weights(BASE, Shaping(), BASE, OLD, MASK)
    assert w["effective_weight/0.00-0.25"] == 1.0 and w["effective_weight/0.75-1.00"] == 1.0
    assert w["effective_weight_tokens/0.00-0.25"] == 3 and w["effective_weight_tokens/0.75-1.00"] == 2
    assert w["effective_weight_tokens/0.25-0.50"] == 0 and "effective_weight/0.25-0.50" not in w


def test_ar_weight_per_bucket_by_hand():
    adv = advantage_reweight(BASE, OLD, 0.5)  # 0.5 p + 0.5
    w = effective_weights(adv, Shaping(), BASE, OLD, MASK)
    assert w["effective_weight/0.00-0.25"] == pytest.approx((0.55 + 0.6 + 0.55) / 3)
    assert w["effective_weight/0.50-0.75"] == pytest.approx(0.8)
    assert w["effective_weight/0.75-1.00"] == pytest.approx(0.95)  # [0, 3] and [1, 1]; [1, 2] has A = 0


def test_a_correction_weight_and_a_phase_enter():
    corr = torch.full_like(BASE, 0.5)
    low = MASK.bool() & (P_OLD < 0.5)
    w = effective_weights(BASE, Shaping(loss_weight=corr), BASE, OLD, low.float())
    assert w["effective_weight/0.00-0.25"] == 0.5 and w["effective_weight_tokens/0.75-1.00"] == 0
