"""Generator: the original distribution, uniqueness, determinism, and the official stream."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from conftest import need_fixture

from arlopti.tasks.kk import render
from arlopti.tasks.kk.generator import StatementSampler, sample_logical_puzzles, sample_puzzles
from arlopti.tasks.kk.logic import depth, is_leaf, parse_statements
from arlopti.tasks.kk.solver import solve

GROUP = {"telling-truth": "leaf", "lying": "leaf", "not": "not", "and": "and/or", "or": "and/or",
         "->": "->/<=>", "<=>": "->/<=>"}
TARGET = {"leaf": 1 / 6, "not": 1 / 6, "and/or": 1 / 3, "->/<=>": 1 / 3}


def top_level_frequencies(statements) -> dict[str, float]:
    counts = collections.Counter(GROUP[s[0]] for s in statements)
    total = sum(counts.values())
    return {k: counts[k] / total for k in TARGET}


def check_puzzles(n, count):
    puzzles = sample_logical_puzzles(n, count, seed=1234)
    assert len(puzzles) == count
    assert len({s for s, _ in puzzles}) == count  # no repeated statement tuple
    for statements, solution in puzzles:
        assert solve(statements, n) == [solution]
        for i, s in enumerate(statements):
            assert depth(s) <= 2
            assert s != ("lying", i)  # nobody says "I am a knave"
            if not is_leaf(s):
                ops = s[1:]
                assert all(is_leaf(o) for o in ops) and len(set(ops)) == len(ops)
                assert len(ops) == (1 if s[0] == "not" else 2)
    return puzzles


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_thousand_unique_puzzles_per_n(n):
    # Only 399 distinct uniquely-solvable 2-person puzzles exist at depth 2 (the original
    # generator makes 300 for N=2: 100 test + 200 train), so N=2 draws 300.
    check_puzzles(n, 300 if n == 2 else 1000)


def test_few_puzzles_for_large_n():
    for n in (9, 10, 12):
        check_puzzles(n, 5)


def test_raw_sampler_follows_the_die():
    sampler = StatementSampler(np.random.default_rng(0), 5)
    draws = [sampler.statement(i % 5, 2) for i in range(30_000)]
    freq = top_level_frequencies(draws)
    for k, target in TARGET.items():
        assert abs(freq[k] - target) < 0.01, (k, freq)


def test_accepted_puzzles_keep_the_distribution_within_two_points():
    # The uniqueness filter shifts the mix at small N (N=3: ->/<=> about 36.6%), so pool N=4..8.
    statements = [s for n in range(4, 9) for ss, _ in sample_logical_puzzles(n, 1000, 1234) for s in ss]
    freq = top_level_frequencies(statements)
    for k, target in TARGET.items():
        assert abs(freq[k] - target) < 0.02, (k, freq)


@pytest.mark.parametrize("n", [3, 5, 7])
def test_seed_1234_reproduces_the_official_logical_puzzles(n):
    path = need_fixture(f"kk/kk_test_{n}ppl.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    stream = sample_logical_puzzles(n, 1100, seed=1234)
    for r in records:  # Logic-RL test = original stream positions 1000..1099
        statements, solution = stream[r["index"]]
        assert statements == parse_statements(r["statements"], n)
        assert list(solution) == r["solution"]


def test_same_seed_same_output_different_seed_differs():
    a = sample_puzzles(4, 30, seed=7)
    assert a == sample_puzzles(4, 30, seed=7)
    b = sample_puzzles(4, 30, seed=8)
    assert [p.statements for p in a] != [p.statements for p in b]
    assert [p.quiz for p in a] != [p.quiz for p in b]


def test_prefix_does_not_depend_on_count():
    assert sample_puzzles(3, 5, seed=3) == sample_puzzles(3, 12, seed=3)[:5]


@pytest.mark.parametrize("bad", [0, 1, 13, 100, -2, 2.5, True])
def test_num_people_outside_range_raises(bad):
    with pytest.raises(ValueError, match=r"num_people.*2\.\.12"):
        sample_puzzles(bad, 1, seed=0)


def test_bad_depth_or_width():
    with pytest.raises(ValueError, match="width"):
        sample_puzzles(2, 1, seed=0, width=4)
    with pytest.raises(ValueError, match="depth"):
        sample_puzzles(3, 1, seed=0, depth=0)


def test_wider_and_deeper_statements():
    for statements, solution in sample_logical_puzzles(4, 50, seed=1, depth=3, width=3):
        assert solve(statements, 4) == [solution]
        assert all(depth(s) <= 3 for s in statements)
        for s in statements:
            if s[0] in ("and", "or"):
                assert 2 <= len(s) - 1 <= 3


def test_rendered_puzzles():
    for n in (2, 3, 8, 12):
        for i, p in enumerate(sample_puzzles(n, 10, seed=5)):
            assert p.index == i and p.num_people == n
            assert len(set(p.names)) == n and set(p.names) <= set(render.NAMES)
            assert p.quiz.startswith(render.PREAMBLE.format(count=n, names=render.join_names(p.names)))
            assert p.quiz.endswith(render.QUESTION)
            assert p.solution_text_format == render.solution_text_format(p.names, p.solution)


def test_asking_for_more_puzzles_than_exist_fails_clearly():
    with pytest.raises(RuntimeError, match="399 for N=2"):
        sample_logical_puzzles(2, 500, seed=0)
