"""DAPO's data-side functions (arlopti.plugins.dapo), on hand-computed values, and the overlong
penalty against verl's DAPO reward manager restated."""

from __future__ import annotations

import pytest
import torch

from arlopti.plugins.dapo import GroupSelection, has_signal, need_more_rounds, overlong_penalty, select_groups


def verl_overlong_reward(length: int, max_resp_len: int, buffer_len: int, factor: float) -> float:
    """verl/workers/reward_manager/dapo.py, DAPORewardManager.__call__, restated: the reward added
    to a response of ``length`` valid tokens."""
    expected_len = max_resp_len - buffer_len
    exceed_len = length - expected_len
    return min(-exceed_len / buffer_len * factor, 0.0)


def test_overlong_penalty_is_eq13_by_hand():
    # L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and beyond
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 12])
    got = overlong_penalty(lengths, max_len=10, buffer=4, factor=1.0)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    half = overlong_penalty(lengths, max_len=10, buffer=4, factor=0.5)
    assert half.tolist() == [0.0, 0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5]


@pytest.mark.parametrize("max_len,buffer,factor", [(10, 4, 1.0), (16, 3, 0.7), (20480, 4096, 1.0), (8, 8, 2.0)])
def test_overlong_penalty_equals_verl_up_to_the_maximum_length(max_len, buffer, factor):
    lengths = list(range(0, max_len + 1))
    ours = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor)
    theirs = torch.tensor([verl_overlong_reward(n, max_len, buffer, factor) for n in lengths], dtype=torch.float32)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_overlong_penalty_refuses_a_bad_buffer():
    with pytest.raises(ValueError, match="overlong_buffer=0"):
        overlong_penalty(torch.tensor([3]), max_len=10, buffer=0)
    with pytest.raises(ValueError, match="overlong_buffer=11 exceeds rollout.max_new_tokens=10"):
        overlong_penalty(torch.tensor([3]), max_len=10, buffer=11)


def test_has_signal_is_rewards_not_all_equal():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [-3.0, -3.0, -3.0], [0.5, 0.5, 0.50001]])
    assert has_signal(rewards).tolist() == [False, True, False, True]
    assert has_signal(torch.zeros(0, 4)).tolist() == []
    with pytest.raises(ValueError, match="groups, group_size"):
        has_signal(torch.zeros(4))


def test_need_more_rounds():
    assert need_more_rounds(kept=3, target=4, rounds=1, max_rounds=3)
    assert not need_more_rounds(kept=4, target=4, rounds=1, max_rounds=3)  # enough
    assert not need_more_rounds(kept=9, target=4, rounds=1, max_rounds=3)
    assert not need_more_rounds(kept=0, target=4, rounds=3, max_rounds=3)  # out of rounds
    assert not need_more_rounds(kept=0, target=4, rounds=1, max_rounds=1)  # max_gen_batches=1: one round only


def test_select_groups_takes_the_first_target_in_generation_order():
    flags = [[True, False, False, True], [False, True, True, True]]  # P = 4, two rounds, 5 with signal
    one = select_groups(flags, target=4, world=1)
    assert one == GroupSelection([(0, 0), (0, 3), (1, 1), (1, 2)], False)  # (1, 3) is trimmed
    two = select_groups(flags, target=4, world=2)
    assert two.groups == one.groups  # the set does not depend on the world size
    assert two.share(0, 2) == [(0, 0), (0, 3)] and two.share(1, 2) == [(1, 1), (1, 2)]
    assert one.share(0, 1) == one.groups


def test_select_groups_with_too_few_cuts_to_the_world_size_or_falls_back():
    flags = [[True, False, False, False], [False, False, True, True]]  # 3 with signal after the last round
    assert select_groups(flags, target=4, world=1).groups == [(0, 0), (1, 2), (1, 3)]
    assert select_groups(flags, target=4, world=2) == GroupSelection([(0, 0), (1, 2)], False)
    # one group with signal on 2 ranks, none on 1 rank: round 0's groups, unfiltered
    assert select_groups([[False, True, False, False]], 4, world=2) == GroupSelection(
        [(0, 0), (0, 1), (0, 2), (0, 3)], True)
    none = select_groups([[False] * 4, [False] * 4], 4, world=1)
    assert none.fallback and none.groups == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert none.share(1, 2) == [(0, 2), (0, 3)]  # each rank keeps its own round-0 groups
    with pytest.raises(ValueError, match="at least one round"):
        select_groups([], 4)
