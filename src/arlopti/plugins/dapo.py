"""DAPO's data-side pieces as pure functions (Yu et al. 2025, *DAPO: An Open-Source LLM
Reinforcement Learning System at Scale*, arXiv 2503.14476).

**Overlong reward shaping** (DAPO §3.4, eq. 13), :func:`overlong_penalty`. With ``L_max`` the
maximum response length (``rollout.max_new_tokens``), ``L_cache`` the buffer
(``algorithm.dapo.overlong_buffer``) and ``c`` the penalty factor (``algorithm.dapo.overlong_penalty``,
DAPO: 1), a response of ``|y|`` tokens gets, added to its task reward,

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache · c    if L_max - L_cache < |y| <= L_max
                = -c                                  if |y| > L_max

i.e. a linear ramp from 0 at ``L_max - L_cache`` to ``-c`` at ``L_max``. ``|y|`` counts response
tokens, the EOS token included (what the engine returned). Checked against verl's DAPO reward
manager (``verl/workers/reward_manager/dapo.py``, ``DAPORewardManager.__call__``): there
``expected_len = max_resp_len - overlong_buffer_len``, ``exceed_len = valid_response_length -
expected_len`` (the response's attention-mask length) and the added reward is
``min(-exceed_len / overlong_buffer_len · penalty_factor, 0)``, equal to eq. 13 for every
``|y| <= L_max``; verl does not clamp beyond ``L_max`` (a response cannot be longer there), eq. 13
does, and so do we.

**Dynamic sampling** (DAPO §3.2, eq. 11: ``0 < |{o_i : is_equivalent(a, o_i)}| < G``): a group
whose ``G`` rewards are all equal has zero advantage under every group baseline, so it carries no
policy-gradient signal and is dropped (:func:`has_signal`). verl's DAPO trainer
(``recipe/dapo/dapo_ray_trainer.py``, ``RayDAPOTrainer.fit``) keeps a group when the population std
of its filter metric is > 0, concatenates the kept groups of successive generation batches until
``train_batch_size`` prompts are kept, then keeps the first ``train_batch_size`` of them in
generation order; after ``max_num_gen_batches`` batches it raises an error. We filter on the
reward the advantage uses (task reward plus overlong shaping; verl's recipe filters on ``acc`` by
default, its ``metric`` option also allows the score), and after ``max_gen_batches`` rounds we
train on what there is instead of stopping (:func:`select_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from arlopti.config.rules import check_overlong_buffer

__all__ = ["GroupSelection", "has_signal", "need_more_rounds", "overlong_penalty", "select_groups"]


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO eq. 13 (module docstring): the reward added to responses of ``lengths`` tokens.

    ``lengths`` [B] (any numeric dtype) → float32 [B], values in ``[-factor, 0]``. ``buffer`` is
    ``L_cache`` (> 0), ``max_len`` is ``L_max`` (``buffer <= max_len``).
    """
    if buffer <= 0:
        raise ValueError(f"algorithm.dapo.overlong_buffer={buffer}: the shaping needs a buffer > 0 tokens")
    check_overlong_buffer(buffer, max_len)
    expected = max_len - buffer
    excess = lengths.to(torch.float32) - expected
    ramp = -excess / buffer * factor
    return ramp.clamp(min=-factor, max=0.0)


def has_signal(rewards: Tensor) -> Tensor:
    """``rewards`` [groups, G] → bool [groups]: True where the group's rewards are not all equal
    (max ≠ min, exactly: DAPO eq. 11's rule). A group of one response has no baseline to differ
    from and is False (our groups have G ≥ 2: ``sizes.group_size``).

    **Not always verl's.** verl's recipe keeps a group when ``np.std(metric_vals) > 0``, and
    ``np.std`` of equal values is not always 0: the mean of G copies of r is rounded, so for some
    r and G (G not a power of 2) it is a few 1e-17 (``np.std([0.7] * 3)`` = 1.1e-16,
    ``np.std([0.1] * 3)`` = 1.4e-17). verl then keeps that all-equal group (zero advantage, no
    signal); we drop it (tests/algorithms/test_algorithm_docs.py). With 0/1 rewards the two agree."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool)
    return rewards.amax(dim=1) != rewards.amin(dim=1)


def need_more_rounds(kept: int, target: int, rounds: int, max_rounds: int) -> bool:
    """Another generation round? Yes while fewer than ``target`` groups (all ranks) carry signal and
    fewer than ``max_rounds`` rounds have run (verl: ``num_prompt_in_batch < train_batch_size`` and
    ``num_gen_batches < max_num_gen_batches``)."""
    return kept < target and rounds < max_rounds


@dataclass(frozen=True)
class GroupSelection:
    """The groups a rollout step trains on, as ``(round, global index in that round)`` in training
    order; rank ``r`` of ``W`` takes the ``r``-th contiguous ``len(groups) / W`` of them.
    ``fallback``: no group carried signal (or fewer than ``W``), so these are round 0's groups,
    unfiltered."""

    groups: list[tuple[int, int]]
    fallback: bool

    def share(self, rank: int, world: int) -> list[tuple[int, int]]:
        n = len(self.groups) // world
        return self.groups[rank * n:(rank + 1) * n]


def select_groups(flags: Sequence[Sequence[bool]], target: int, world: int = 1) -> GroupSelection:
    """Which groups to train on, from every round's signal flags in global order (round ``k``'s
    list holds the flags of its ``P`` groups, rank 0's first; one list per round run).

    * the groups with signal in generation order (round, then global index), at most ``target``
      of them (verl's ``batch[:traj_bsz]``);
    * cut to a multiple of ``world``, so that every rank trains on the same number of groups
      (its mini-batch loop and every backward are collectives); on 1 rank nothing is cut;
    * if that leaves none: round 0's groups, unfiltered (``fallback``). All but fewer than
      ``world`` of them have zero advantage, so the policy-gradient term is (nearly) zero and the
      step amounts to what GRPO without filtering does on that batch (KL, entropy and the
      optimizer's momentum still act). The learner needs at least one row per rank.

    Pure: the same flags give the same selection on every rank and for any ``world`` that divides
    ``P`` (the cut aside), which is what makes 1 rank = N ranks.
    """
    if not flags:
        raise ValueError("select_groups needs at least one round of flags")
    if target < 1 or world < 1:
        raise ValueError(f"target={target} and world={world} must be >= 1")
    chosen = [(k, i) for k, round_flags in enumerate(flags) for i, f in enumerate(round_flags) if f][:target]
    chosen = chosen[:len(chosen) // world * world]
    if chosen:
        return GroupSelection(chosen, False)
    return GroupSelection([(0, i) for i in range(len(flags[0]))], True)
