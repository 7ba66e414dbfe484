"""A toy multi-turn environment for the tiny random model: the learning test of multi-turn training.

:class:`ToyWordsEnv` (text contract, :mod:`arlopti.tasks.env.base`) plays :attr:`ToyWordsEnv.turns`
model turns. A model turn ends at its first space (run it with ``rollout.stop=[" "]``: the tiny model
never samples its end-of-turn token, and a turn cut at its token limit ends the episode), so a turn is
about one word; the environment answers each turn but the last with :attr:`ToyWordsEnv.reply`, plain
text continuing the same message (a turn stopped by a stop string is continued, not answered as a new
chat message). Each turn but the last earns :func:`letter_share` of its text as the turn's reward; the
last turn is the final answer, which a task scores (the learning test scores it with the same
:func:`letter_share`). An episode whose turn hits the token limit ends there, without the later turns'
rewards, so the policy gains both from letters a-m and from ending its turns with a space.

The reward can be raised by the tiny model in a few dozen updates (it starts near 0.25 per turn: the
share of a-m letters in its random word pieces), which is what ``tests/learner/test_multiturn_learning.py``
measures, against a control run whose noise sets the margin.
"""

from __future__ import annotations

from arlopti.tasks.env.base import TextEnv

#: Characters of a turn that count towards its reward.
WINDOW = 8


def letter_share(text: str) -> float:
    """The share of the first :data:`WINDOW` characters of ``text`` that are the letters a-m, in [0, 1]
    (a turn shorter than the window counts its missing characters as 0)."""
    return sum("a" <= c <= "m" for c in text[:WINDOW]) / WINDOW


class ToyWordsEnv(TextEnv):
    """See the module docstring. ``turns`` model turns; ``reply`` between them."""

    turns: int = 3
    reply: str = "then "

    def __init__(self):
        self.turn = 0

    def reset(self, row: dict) -> str | None:
        self.turn = 0
        return None

    def step(self, text: str) -> tuple[str | None, bool, float | None]:
        self.turn += 1
        if self.turn >= self.turns:
            return None, True, None  # the final answer: the task scores it
        return self.reply, False, letter_share(text)


__all__ = ["WINDOW", "ToyWordsEnv", "letter_share"]
