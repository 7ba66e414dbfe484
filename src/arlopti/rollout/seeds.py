"""Every sampling seed of a run, in one place.

* :func:`step_seed`: the seed of one generation round of a rollout step on one rank, derived from
  ``rollout.seed``, the step and the rank; DAPO's dynamic-sampling round ``k >= 1`` derives its own
  from the step seed and ``k`` (round 0 is the step seed itself).
* :func:`sample_seed`: the seed of one response, from the round's seed, the prompt's index in the
  step and the sample's index in its group. Every engine (HF, colocated vLLM, the rollout workers)
  seeds response ``(i, j)`` with it, so a response is reproducible whatever else is in the batch and
  the placements give the same tokens.
* :func:`turn_seed`: a multi-turn episode's model turn ``t >= 1`` is generated with the round seed of
  that turn (turn 0 is the round's own seed, as a single response); the turn's request ``k`` (the
  episodes still running, in step order) then takes ``sample_seed(turn seed, k, 0)``.
* :func:`env_seed`: the seed Python's ``random`` holds during one environment call of an episode
  (the same for the G resets of a prompt, so its G episodes start from the same state).

Both are stable across Python processes (a keyed hash, not Python's ``hash``).
"""

from __future__ import annotations

import hashlib

_SEED_31 = 0x7FFFFFFF


def sample_seed(base: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one response, stable across Python processes."""
    digest = hashlib.blake2b(f"{base}/{prompt_index}/{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def step_seed(base: int, rollout_step: int, rank: int, round_index: int = 0) -> int:
    """The sampling seed of one generation round (31 bits): round 0 is
    ``sample_seed(base, rollout_step, rank)``, round ``k >= 1`` is ``sample_seed(round 0's seed, k, 0)``."""
    step = sample_seed(base, rollout_step, rank) & _SEED_31
    return step if round_index == 0 else sample_seed(step, round_index, 0) & _SEED_31


def turn_seed(round_seed: int, turn: int) -> int:
    """The seed of model turn ``turn`` of a round's multi-turn episodes (31 bits; turn 0: ``round_seed``)."""
    return round_seed if turn == 0 else sample_seed(round_seed, -1, turn) & _SEED_31


def env_seed(round_seed: int, call: str, prompt_index: int, sample_index: int = 0, turn: int = 0) -> int:
    """The seed of one environment call (``call``: ``reset``, ``step``, ...) of episode ``(prompt, sample)``
    at model turn ``turn``, stable across Python processes."""
    digest = hashlib.blake2b(f"{round_seed}/{call}/{prompt_index}/{sample_index}/{turn}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


__all__ = ["env_seed", "sample_seed", "step_seed", "turn_seed"]
