"""Solver: brute force over 2^N assignments, checked against a naive evaluator and the official data."""

from __future__ import annotations

import gzip
import itertools
import json

import numpy as np
import pytest
from conftest import need_fixture

from arlopti.tasks.kk.generator import StatementSampler
from arlopti.tasks.kk.logic import evaluate, parse_statements
from arlopti.tasks.kk.puzzle import Puzzle
from arlopti.tasks.kk.solver import count_solutions, person_tables, solve, truth_table


def naive_solve(statements, n):
    """Reference: test every assignment with the recursive evaluator."""
    out = []
    for bits in itertools.product([False, True], repeat=n):
        if all(bits[i] == evaluate(s, bits) for i, s in enumerate(statements)):
            out.append(bits)
    return sorted(out, key=lambda b: sum(int(x) << i for i, x in enumerate(b)))


def test_person_tables_encode_bit_i():
    full, knight = person_tables(3)
    assert full == 0xFF
    for i in range(3):
        for code in range(8):
            assert ((knight[i] >> code) & 1) == ((code >> i) & 1)


@pytest.mark.parametrize("n", [2, 3, 5, 7])
def test_solver_matches_naive_evaluator_on_random_statements(n):
    sampler = StatementSampler(np.random.default_rng(n), n, depth=3, width=3)
    for _ in range(200):
        statements = sampler.puzzle()
        assert solve(statements, n) == naive_solve(statements, n)
        for s in statements:  # each truth table bit agrees with the evaluator
            table = truth_table(s, n)
            for code in range(1 << n):
                bits = tuple(bool((code >> i) & 1) for i in range(n))
                assert bool((table >> code) & 1) == evaluate(s, bits)


def test_classic_two_person_puzzle():
    # A: "B is a knave"; B: "A and I are both knights" -> A knight, B knave.
    statements = (("lying", 1), ("and", ("telling-truth", 0), ("telling-truth", 1)))
    assert solve(statements, 2) == [(True, False)]
    # "I am a knight" twice: every assignment consistent.
    assert count_solutions((("telling-truth", 0), ("telling-truth", 1)), 2) == 4
    # "A is not a knight" said by A: paradox, no solution.
    assert solve((("not", ("telling-truth", 0)), ("telling-truth", 1)), 2) == []


def test_solve_twelve_people():
    n = 12
    # Person i says "i+1 is a knave" (so roles alternate); the last says something always false,
    # so the last person is a knave, which fixes the alternation.
    always_false = ("<=>", ("telling-truth", 0), ("lying", 0))
    statements = tuple(("lying", i + 1) for i in range(n - 1)) + (always_false,)
    sols = solve(statements, n)
    assert sols == naive_solve(statements, n)
    assert len(sols) == 1 and sols[0] == tuple(i % 2 == 0 for i in range(n))
    sampler = StatementSampler(np.random.default_rng(0), n)
    for _ in range(20):
        s = sampler.puzzle()
        assert solve(s, n) == naive_solve(s, n)


def test_solve_rejects_wrong_length():
    with pytest.raises(ValueError, match="num_people=3"):
        solve((("telling-truth", 0),), 3)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_official_test_puzzles_have_exactly_the_stored_solution(n):
    path = need_fixture(f"kk/kk_test_{n}ppl.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 100
    for lineno, line in enumerate(lines, 1):
        p = Puzzle.from_record(json.loads(line), source=f"{path}:{lineno}")
        assert p.num_people == n
        assert solve(p.statements, n) == [p.solution]


def test_official_train_puzzles_solve_uniquely():
    path = need_fixture("kk/kk_train_34567ppl.jsonl.gz")
    with gzip.open(path, "rt") as fh:
        records = [json.loads(line) for line in fh]
    assert len(records) == 4500
    per_n = {}
    for r in records:
        n = len(r["names"])
        per_n[n] = per_n.get(n, 0) + 1
        assert solve(parse_statements(r["statements"], n), n) == [tuple(r["solution"])]
    assert per_n == {3: 900, 4: 900, 5: 900, 6: 900, 7: 900}
