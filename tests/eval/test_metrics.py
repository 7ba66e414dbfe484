"""avg@k, pass@k and the unbiased pass@k estimator on hand-computed values."""

import math

import pytest
import torch

from arlopti.eval.metrics import AvgAtK, PassAtK, group_by_uid, pass_at_k


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)   # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(3, 2, 2) == 1.0  # n - c < k: every k-subset holds a correct sample
    for bad in ((2, 3, 1), (3, 1, 4), (3, -1, 1), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_avg_and_pass_at_k_by_hand():
    # 3 problems x 4 samples: 2/4, 0/4 and 4/4 correct.
    correct = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    avg, pas = AvgAtK(4), PassAtK(4)
    avg.update(correct)
    pas.update(correct)
    assert avg.compute().item() == pytest.approx(6 / 12)
    assert pas.compute().item() == pytest.approx(2 / 3)


def test_updates_accumulate_like_one_big_batch():
    a, b = torch.tensor([[1, 0], [0, 0]]), torch.tensor([[1, 1]])
    avg, pas = AvgAtK(2), PassAtK(2)
    for x in (a, b):
        avg.update(x)
        pas.update(x)
    assert avg.compute().item() == pytest.approx(3 / 6)
    assert pas.compute().item() == pytest.approx(2 / 3)
    avg.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(avg.compute().item())


def test_pass_at_k_with_more_samples_uses_the_estimator():
    correct = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]])
    pas = PassAtK(2)
    pas.update(correct)
    assert pas.compute().item() == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 2)


def test_shape_checks():
    with pytest.raises(ValueError, match="exactly 4"):
        AvgAtK(4).update(torch.ones(2, 3))
    with pytest.raises(ValueError, match="at least 4"):
        PassAtK(4).update(torch.ones(2, 3))
    with pytest.raises(ValueError, match="num_problems, samples"):
        AvgAtK().update(torch.ones(5))


def test_states_are_summed_across_processes():
    # The distributed reduction is a sum of the states; merging two metrics must equal one.
    x, y = torch.tensor([[1, 0, 0]]), torch.tensor([[0, 0, 0], [1, 1, 1]])
    m1, m2, both = PassAtK(3), PassAtK(3), PassAtK(3)
    m1.update(x)
    m2.update(y)
    both.update(torch.cat([x, y]))
    m1.merge_state(m2)
    assert m1.compute().item() == pytest.approx(both.compute().item()) == pytest.approx(2 / 3)
    from torchmetrics.utilities.data import dim_zero_sum

    for metric in (PassAtK(3), AvgAtK(3)):
        assert set(metric._reductions.values()) == {dim_zero_sum}


def test_group_by_uid():
    uids = ["a", "b", "a", "b", "c", "c"]
    correct = [True, False, False, False, 1, 1]
    assert group_by_uid(uids, correct).tolist() == [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    with pytest.raises(ValueError, match="different sample counts"):
        group_by_uid(["a", "a", "b"], [1, 1, 1])
