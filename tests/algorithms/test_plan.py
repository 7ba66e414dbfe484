"""``step_order``, ``phase_pass_ends`` and ``phase_names`` by hand."""

from __future__ import annotations


import pytest
import torch

from arlopti.algorithms import phase_plan
from arlopti.algorithms.plan import phase_names, phase_pass_ends, step_order

MB = [[0, 1], [2, 3], [4, 5]]


def test_batch_granularity_is_a_full_pass_per_phase():
    assert step_order(["low", "high"], MB) == [("low", [0, 1]), ("low", [2, 3]), ("low", [4, 5]),
                                               ("high", [0, 1]), ("high", [2, 3]), ("high", [4, 5])]


def test_minibatch_granularity_interleaves_the_phases():
    assert step_order(["low", "high"], MB[:2], granularity="minibatch") == [
        ("low", [0, 1]), ("high", [0, 1]), ("low", [2, 3]), ("high", [2, 3])]


def test_reverse_order_and_epochs_repeat_the_plan():
    order = step_order(phase_names(0.5, reverse=True), MB[:2], epochs=2)
    assert [p for p, _ in order] == ["high", "high", "low", "low"] * 2
    assert [mb for _, mb in order] == [[0, 1], [2, 3]] * 4


def test_one_phase_ignores_granularity():
    assert step_order(["all"], MB, granularity="minibatch") == [("all", mb) for mb in MB]
    assert phase_names(None) == ["all"] and phase_names(0.3) == ["low", "high"]


def test_phase_names_match_phase_plan():
    mask = torch.ones(1, 3)
    old = torch.log(torch.tensor([[0.1, 0.6, 0.9]]))
    for rev in (False, True):
        assert phase_names(0.5, rev) == [p.name for p in phase_plan(mask, old, 0.5, rev)]


def test_phase_pass_ends_mark_each_run_of_one_phase():
    order = step_order(["low", "high"], MB[:2])
    assert phase_pass_ends(order) == [False, True, False, True]
    assert phase_pass_ends(step_order(["low", "high"], MB[:2], granularity="minibatch")) == [True] * 4
    assert phase_pass_ends(step_order(["all"], MB, epochs=2)) == [False] * 5 + [True]


@pytest.mark.parametrize("bad", [dict(granularity="token"), dict(epochs=0)])
def test_bad_plans_name_the_key(bad):
    with pytest.raises(ValueError, match="granularity|ppo_epochs"):
        step_order(["all"], MB, **bad)
