"""checkpoint["arlopti"] (arlopti.learner.checkpoint_state): the policy version is recorded explicitly
(issue 27), and checkpoints saved before it existed still load."""

from __future__ import annotations

import pytest

from arlopti.learner.checkpoint_state import learner_state, load_learner_state, saved_policy_version
from arlopti.learner.guard import NonFiniteGuard


def _load(extra: dict):
    return load_learner_state({"arlopti": extra}, policy=None, guard=NonFiniteGuard(3), rank=0, world_size=1)


def test_the_policy_version_is_the_rollout_step_and_round_trips():
    state = learner_state(7, 15, {"total_skips": 1, "consecutive_skips": 0}, world_size=1)
    assert state["policy_version"] == state["rollout_step"] == 7
    step, version, rng = _load(state)
    assert (step, version) == (7, 15) and rng is not None
    assert saved_policy_version({"arlopti": state}) == 7


def test_a_checkpoint_without_policy_version_loads_as_before():
    old = {"rollout_step": 4, "weight_version": 9, "total_skips": 0, "consecutive_skips": 0}
    assert _load(old)[:2] == (4, 9)
    assert saved_policy_version({"arlopti": old}) == 4 and saved_policy_version({}) == 0


def test_a_policy_version_that_disagrees_with_the_rollout_step_is_refused():
    with pytest.raises(ValueError, match="policy_version=3 but rollout_step=4"):
        _load({"rollout_step": 4, "policy_version": 3, "weight_version": 9})
