"""``step_inputs`` and ``FirstStepInputs`` by hand: AR, phase masks and skipped phases decided once,
and the reused first forward's per-micro-batch inputs equal to the complete StepInputs' slices."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from arlopti.algorithms import advantage_reweight, lopti_masks
from arlopti.algorithms.inputs import FirstStepInputs, StepInputs, step_inputs

# p_old = 0.1, 0.5, 0.9 | 0.2, 0.6, (pad)
OLD = torch.log(torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.6, 1.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = OLD * MASK
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])


def _complete(eta, reverse=False, skip_empty=True, calls=None):
    def total(x):
        if calls is not None:
            calls.append(x)
        return x
    return step_inputs(OLD, None, ADV, MASK, ar_alpha=0.5, eta=eta, reverse=reverse, skip_empty=skip_empty,
                       sum_over_ranks=total)


def test_ar_and_phase_masks_by_hand():
    t = _complete(eta=0.4)
    p = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.6, 1.0]])
    torch.testing.assert_close(t.advantages, (0.5 * p + 0.5) * ADV)  # A' = (α·p_old + 1 − α)·A
    assert list(t.phases) == ["low", "high"]
    assert t.phases["low"].token_mask.tolist() == [[True, False, False], [True, False, False]]
    assert t.phases["high"].token_mask.tolist() == [[False, True, True], [False, True, False]]
    assert t.skipped == frozenset()
    assert list(_complete(eta=0.4, reverse=True).phases) == ["high", "low"]
    assert list(_complete(eta=None).phases) == ["all"]


def test_an_empty_phase_is_skipped_only_under_skip():
    calls = []
    assert _complete(eta=0.05, calls=calls).skipped == frozenset({"low"})
    assert calls == [0.0, 5.0]  # one reduction per phase: the token counts
    calls.clear()
    assert _complete(eta=0.05, skip_empty=False, calls=calls).skipped == frozenset()
    assert calls == []  # empty_phase=step needs no collective


def test_step_inputs_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _complete(eta=0.4).advantages = ADV


@pytest.mark.parametrize("phase, eta", [("low", 0.4), ("high", 0.4), ("all", None)])
def test_the_first_forward_gives_the_complete_inputs_slices(phase, eta):
    """A micro-batch of rows [1, 0] through FirstStepInputs: its old, AR and phase mask come from
    its own log-probs and equal the slices of the StepInputs completed afterwards."""
    old = torch.zeros_like(MASK)
    ff = FirstStepInputs(old, None, ADV, 0.5, eta)
    idx = torch.tensor([1, 0])
    got = ff.micro(phase, idx, 3, OLD[idx], MASK[idx])
    t = step_inputs(ff.old, None, ADV, MASK, ar_alpha=0.5, eta=eta, reverse=False, skip_empty=True,
                    sum_over_ranks=lambda x: x)
    assert isinstance(t, StepInputs)
    for a, b in zip(got, t.micro(phase, idx, 3, OLD[idx], MASK[idx])):
        assert torch.equal(a, b)
    assert torch.equal(ff.old[idx], OLD[idx])  # the forward's logπ_old was written back


def test_the_first_steps_inputs_by_hand():
    logp = torch.log(torch.tensor([[0.1, 0.6, 0.9], [0.3, 0.2, 0.5]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    rows = torch.tensor([0, 1])

    def first(alpha, phase, eta):
        return FirstStepInputs(torch.zeros_like(mask), None, adv, alpha, eta).micro(phase, rows, 3, logp, mask)

    old, a, low = first(0.3, "low", 0.4)
    assert not old.requires_grad and old[1, 2] == 0
    # AR by hand: (0.3 p + 0.7) A
    assert a[0, 1].item() == pytest.approx((0.3 * 0.6 + 0.7) * 1.0)
    assert a[1, 0].item() == pytest.approx((0.3 * 0.3 + 0.7) * -2.0)
    assert low.tolist() == [[True, False, False], [True, True, False]]
    _, _, high = first(0.3, "high", 0.4)
    assert high.tolist() == [[False, True, True], [False, False, False]]
    assert torch.equal(a, advantage_reweight(adv, old, 0.3))
    assert torch.equal(low, lopti_masks(old, mask, 0.4)[0])
    _, a_all, every = first(0.0, "all", None)
    assert torch.equal(a_all, adv) and torch.equal(every, mask.bool())
    assert math.isclose(float(old[0, 0].exp()), 0.1, rel_tol=1e-6)
