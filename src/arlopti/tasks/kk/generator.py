"""K&K puzzle generator following the original mem-kk-logic sampling distribution.

Per statement (``_sample_statement``), a die uniform on 0..5 is rolled: 0 gives a leaf, 1 ``not``,
2 ``and``, 3 ``or``, 4 ``->``, 5 ``<=>``; when the remaining depth is 1 a leaf is forced (the die
is still rolled). A leaf draws its kind (knight/knave) and its target person uniformly, re-drawn
while it would be "I am a knave". ``and``/``or`` take between 2 and ``width`` operands, ``->`` and
``<=>`` two; operands are sampled at depth-1 and de-duplicated within one operator. So at the
default depth 2 the top level is leaf 1/6, not 1/6, and/or 1/3, ->/<=> 1/3, and every operand is a
leaf.

A puzzle (one statement per person) is re-sampled, up to ``max_retry`` times, until exactly one
assignment is consistent and the statement tuple has not been produced before in this stream.

The random draws are made in the same order and with the same numpy calls as the original
``KKProblemSampler`` (``default_rng(seed)``), so with the original seed 1234 the logical puzzles
equal the published ones: stream position ``i`` is the official record with ``index == i``. The
English text is ours (names and templates from :mod:`arlopti.tasks.kk.render`), drawn from a
separate generator seeded with ``(seed, num_people, i)``, so the text of puzzle ``i`` does not
depend on how many puzzles are drawn.
"""

from __future__ import annotations

import numpy as np

from arlopti.tasks.kk import render
from arlopti.tasks.kk.logic import Statement, Statements
from arlopti.tasks.kk.puzzle import Puzzle, build_puzzle
from arlopti.tasks.kk.solver import consistent_table

MIN_PEOPLE, MAX_PEOPLE = 2, 12
OFFICIAL_SEED = 1234  # mem-kk-logic's sampler seed, the same for every N
_LEAF_KINDS = ["telling-truth", "lying"]


def check_num_people(num_people: int) -> int:
    """Return ``num_people`` or raise ``ValueError`` naming the allowed range."""
    if isinstance(num_people, bool) or not isinstance(num_people, (int, np.integer)) \
            or not MIN_PEOPLE <= num_people <= MAX_PEOPLE:
        raise ValueError(f"num_people={num_people!r} is outside the supported range "
                         f"{MIN_PEOPLE}..{MAX_PEOPLE}")
    return int(num_people)


class StatementSampler:
    """Draws statements from one numpy ``Generator`` in the original call order."""

    def __init__(self, rng: np.random.Generator, num_people: int, depth: int = 2, width: int = 2):
        if depth < 1:
            raise ValueError(f"depth={depth}: must be at least 1")
        # De-duplicated operands need enough distinct leaves: 2N kinds x targets, minus "I am a knave".
        if not 2 <= width <= 2 * num_people - 1:
            raise ValueError(f"width={width}: must be in 2..{2 * num_people - 1} for {num_people} people")
        self.rng, self.num_people, self.depth, self.width = rng, num_people, depth, width

    def statement(self, speaker: int, depth: int) -> Statement:
        rng = self.rng
        dice = rng.integers(0, 6)
        if depth == 1 or dice == 0:
            while True:
                # rng.integers(0, 2) consumes the stream exactly as rng.choice over two kinds does.
                kind = _LEAF_KINDS[int(rng.integers(0, 2))]
                person = int(rng.integers(0, self.num_people))
                if not (kind == "lying" and person == speaker):
                    return (kind, person)
        if dice == 1:
            return ("not", self.statement(speaker, depth - 1))
        if dice in (2, 3):
            count = int(rng.integers(2, self.width + 1))
            return (("and", "or")[dice - 2],) + self.operands(speaker, depth, count)
        return (("->", "<=>")[dice - 4],) + self.operands(speaker, depth, 2)

    def operands(self, speaker: int, depth: int, count: int) -> tuple:
        out: list[Statement] = []
        while len(out) < count:
            stmt = self.statement(speaker, depth - 1)
            if stmt not in out:
                out.append(stmt)
        return tuple(out)

    def puzzle(self) -> Statements:
        return tuple(self.statement(i, self.depth) for i in range(self.num_people))


def sample_logical_puzzles(num_people: int, count: int, seed: int, depth: int = 2, width: int = 2,
                           max_retry: int = 1000) -> list[tuple[Statements, tuple[bool, ...]]]:
    """``count`` distinct uniquely-solvable statement tuples with their solutions.

    Deterministic for ``(num_people, seed, depth, width)``; the first ``k`` results do not depend
    on ``count``. Raises ``RuntimeError`` if ``max_retry`` draws in a row fail.
    """
    num_people = check_num_people(num_people)
    if count < 0:
        raise ValueError(f"count={count}: must be >= 0")
    sampler = StatementSampler(np.random.default_rng(seed), num_people, depth, width)
    seen: set[Statements] = set()
    out = []
    for _ in range(count):
        for _ in range(max_retry):
            statements = sampler.puzzle()
            if statements in seen:
                continue
            ok = consistent_table(statements, num_people)
            if ok and not ok & (ok - 1):  # exactly one bit set: a unique solution
                code = ok.bit_length() - 1
                out.append((statements, tuple(bool((code >> i) & 1) for i in range(num_people))))
                seen.add(statements)
                break
        else:
            raise RuntimeError(f"no new uniquely solvable {num_people}-person puzzle in {max_retry} draws "
                               f"after {len(out)} (depth={depth}, width={width}); small N has few distinct "
                               "puzzles (399 for N=2 at depth 2), ask for fewer")
    return out


def render_rng(seed: int, num_people: int, index: int) -> np.random.Generator:
    """The generator for the names and speech templates of stream position ``index``."""
    return np.random.default_rng([seed, num_people, index])


def sample_puzzles(num_people: int, count: int, seed: int = OFFICIAL_SEED, depth: int = 2,
                   width: int = 2, max_retry: int = 1000) -> list[Puzzle]:
    """``count`` rendered puzzles; puzzle ``i`` has ``index == i`` (its stream position).

    Names are drawn without replacement from :data:`render.NAMES`, one speech template per person
    from :data:`render.SPEECH_TEMPLATES`. ``num_people`` outside 2..12 raises ``ValueError``.
    """
    puzzles = []
    for i, (statements, solution) in enumerate(
            sample_logical_puzzles(num_people, count, seed, depth, width, max_retry)):
        rng = render_rng(seed, num_people, i)
        picks = rng.choice(len(render.NAMES), size=num_people, replace=False)
        names = tuple(render.NAMES[int(j)] for j in picks)
        templates = [int(t) for t in rng.integers(0, len(render.SPEECH_TEMPLATES), size=num_people)]
        puzzles.append(build_puzzle(statements, solution, names, templates, index=i))
    return puzzles
