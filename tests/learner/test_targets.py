"""``complete_targets`` and ``FirstForward`` by hand: AR, phase masks and skipped phases decided once,
and the reused first forward's per-micro-batch inputs equal to the complete Targets' slices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from arlopti.learner.targets import FirstForward, Targets, complete_targets

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
    return complete_targets(OLD, None, ADV, MASK, ar_alpha=0.5, eta=eta, reverse=reverse, skip_empty=skip_empty,
                            sum_over_ranks=total)


def test_ar_and_phase_masks_by_hand():
    t = _complete(eta=0.4)
    p = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.6, 1.0]])
    torch.testing.assert_close(t.adv, (0.5 * p + 0.5) * ADV)  # A' = (α·p_old + 1 − α)·A
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


def test_targets_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _complete(eta=0.4).adv = ADV


@pytest.mark.parametrize("phase, eta", [("low", 0.4), ("high", 0.4), ("all", None)])
def test_the_first_forward_gives_the_complete_targets_slices(phase, eta):
    """A micro-batch of rows [1, 0] through FirstForward: its old, AR and phase mask come from
    its own log-probs and equal the slices of the Targets completed afterwards."""
    old = torch.zeros_like(MASK)
    ff = FirstForward(old, None, ADV, 0.5, eta)
    idx = torch.tensor([1, 0])
    got = ff.micro(phase, idx, 3, OLD[idx], MASK[idx])
    t = complete_targets(ff.old, None, ADV, MASK, ar_alpha=0.5, eta=eta, reverse=False, skip_empty=True,
                         sum_over_ranks=lambda x: x)
    assert isinstance(t, Targets)
    for a, b in zip(got, t.micro(phase, idx, 3, OLD[idx], MASK[idx])):
        assert torch.equal(a, b)
    assert torch.equal(ff.old[idx], OLD[idx])  # the forward's logπ_old was written back
