import pytest
import torch

from arlopti.algorithms import lopti_masks, phase_plan


def test_split_is_strict_and_excludes_padding():
    p = torch.tensor([[0.2, 0.5, 0.7, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    low, high = lopti_masks(torch.log(p), mask, eta=0.5)
    assert low.tolist() == [[True, False, False, False]]  # 0.5 is not < 0.5
    assert high.tolist() == [[False, True, True, False]]  # padding is in neither


def test_masks_partition_valid_tokens():
    old = torch.log(torch.rand(6, 9))
    mask = torch.rand(6, 9) > 0.3
    low, high = lopti_masks(old, mask, 0.4)
    assert not (low & high).any()
    assert torch.equal(low | high, mask)


@pytest.mark.parametrize("eta", [0.0, 1.0, -0.5, 1.2])
def test_eta_range(eta):
    with pytest.raises(ValueError, match="eta"):
        lopti_masks(torch.zeros(1, 1), torch.ones(1, 1), eta)


def test_phase_plan_orders():
    old = torch.log(torch.tensor([[0.1, 0.9]]))
    mask = torch.ones(1, 2)
    assert [p.name for p in phase_plan(mask)] == ["all"]
    assert [p.name for p in phase_plan(mask, old, 0.5)] == ["low", "high"]
    assert [p.name for p in phase_plan(mask, old, 0.5, reverse=True)] == ["high", "low"]
