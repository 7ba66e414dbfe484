"""DAPO's dynamic sampling across data-parallel ranks (DAPO §3.2): the rounds, the global selection
and the redistribution of the kept groups, exact under data parallelism.

The rollout callback (:mod:`arlopti.callbacks.rollout`, whose docstring states the protocol)
generates and scores each round; :func:`dynamic_sampling` decides, from every rank's signal flags,
whether another round runs, which groups the step trains on
(:func:`~arlopti.plugins.dapo.select_groups`) and which of them this rank holds, all-gathering
those generated on another rank. Collective when distributed: every rank calls it once per step
and runs the same number of rounds. Groups are any objects; only ``rewards_of(group)`` is read.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

import torch

from arlopti.plugins.dapo import has_signal, need_more_rounds, select_groups

log = logging.getLogger(__name__)

G = TypeVar("G")


def dynamic_sampling(first: list[G], next_round: Callable[[int], list[G]],
                     rewards_of: Callable[[G], Sequence[float]], *, rank: int, world: int,
                     max_gen_batches: int) -> tuple[list[G], dict[str, float]]:
    """Run rounds ``k = 1, 2, …`` (``next_round(k)``: this rank's groups of round ``k``) after
    ``first`` (round 0) while too few groups over all ranks carry signal, then return this rank's
    groups to train on and its ``sampling_stats`` (``dapo/*``, docs/metrics.md)."""
    per_rank = len(first)
    target = per_rank * world  # sizes.prompts_per_step
    rounds = [first]
    flags = [_gather_flags(_signal_flags(first, rewards_of), world)]
    while need_more_rounds(sum(sum(f) for f in flags), target, len(rounds), max_gen_batches):
        rounds.append(next_round(len(rounds)))
        flags.append(_gather_flags(_signal_flags(rounds[-1], rewards_of), world))
    selection = select_groups(flags, target, world)
    mine = _my_groups(rounds, selection, rank, world, per_rank)
    local_signal = sum(sum(f[rank * per_rank:(rank + 1) * per_rank]) for f in flags)
    kept = sum(sum(f) for f in flags)
    if rank == 0 and (kept < target or selection.fallback):
        log.warning("dynamic sampling: %d of %d groups carry signal after %d round(s) "
                    "(algorithm.dapo.max_gen_batches=%d); training on %s", kept, target, len(rounds),
                    max_gen_batches, "round 0's groups unfiltered" if selection.fallback
                    else f"{len(selection.groups)} groups")
    generated = float(len(rounds) * per_rank)
    stats = {"gen_rounds": float(len(rounds)), "groups_generated": generated,
             "kept_frac": local_signal / generated, "groups_trained": float(len(mine)),
             "no_signal_fallback": float(selection.fallback)}
    return mine, stats


def _signal_flags(groups: list, rewards_of: Callable) -> list[bool]:
    if not groups:
        return []
    return has_signal(torch.tensor([list(rewards_of(g)) for g in groups], dtype=torch.float64)).tolist()


def _all_gather(obj, world: int) -> list:
    """Every rank's ``obj``, in rank order (``torch.distributed.all_gather_object``; ``[obj]`` on one)."""
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _gather_flags(local: list[bool], world: int) -> list[bool]:
    """The round's flags of all ranks, rank 0's first: the global prompt order."""
    return [f for part in _all_gather(local, world) for f in part]


def _my_groups(rounds: list[list], selection, rank: int, world: int, per_rank: int) -> list:
    """This rank's share of the selection; the groups generated elsewhere are all-gathered (only
    those that change rank travel)."""
    if world == 1:
        return [rounds[k][i] for k, i in selection.groups]
    n = len(selection.groups) // world
    leaving = {(k, i): rounds[k][i - rank * per_rank] for j, (k, i) in enumerate(selection.groups)
               if i // per_rank == rank and j // n != rank}
    arrived: dict = {}
    for part in _all_gather(leaving, world):
        arrived.update(part)
    return [rounds[k][i - rank * per_rank] if i // per_rank == rank else arrived[(k, i)]
            for k, i in selection.share(rank, world)]
