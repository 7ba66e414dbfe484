"""The backtracking reasoning trace and the SFT target built on it."""

from __future__ import annotations

import json

import pytest
from conftest import need_fixture

from arlopti.tasks.kk.cot import cot_steps, cot_trace, sft_response
from arlopti.tasks.kk.generator import sample_puzzles
from arlopti.tasks.kk.puzzle import Puzzle, build_puzzle
from arlopti.tasks.kk.reward import score_response


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("style", ["full", "compact"])
def test_sft_response_scores_three(n, style):
    for p in sample_puzzles(n, 40, seed=11):
        response = sft_response(p, style)
        assert score_response(response, p.solution_text_format) == 3
        for tag in ("</think>", "<answer>", "</answer>"):
            assert response.count(tag) == 1
        assert "<think>" not in response
        assert response.startswith(" ") and response.endswith(
            f" </think>\n<answer> {p.solution_text_format} </answer>")


def test_official_puzzles_get_a_valid_trace():
    path = need_fixture("kk/kk_test_5ppl.jsonl")
    for line in path.read_text().splitlines()[:50]:
        p = Puzzle.from_record(json.loads(line))
        assert score_response(sft_response(p), p.solution_text_format) == 3


def test_search_ends_in_the_solution_and_backtracks():
    kinds = set()
    for p in sample_puzzles(4, 60, seed=2):
        steps, solution = cot_steps(p)
        assert solution == p.solution and steps[-1].kind == "solved"
        kinds |= {s.kind for s in steps}
        first = steps[0]
        # Knight is tried first for person 0.
        assert first.person == 0 and first.role is True
    assert kinds == {"assume", "contradiction", "backtrack", "solved"}


def test_trace_wording():
    # A: "B is a knave"; B: "A is a knight and B is a knight".
    p = build_puzzle((("lying", 1), ("and", ("telling-truth", 0), ("telling-truth", 1))), (True, False),
                     ("Ann", "Bob"), [0, 0])
    full = cot_trace(p)
    assert "Assume Ann is a knight." in full
    assert ("Bob cannot be a knight, because this would contradict the claim of Ann that Bob is a "
            "knave.") in full
    assert full.rstrip().endswith("This leads to a feasible solution: Ann is a knight and Bob is a knave.")
    assert cot_trace(p, "compact") == "Ann knight: ok. Bob knight: contradicts Ann. Bob knave: ok. Solved."


def test_backtrack_sentence():
    p = next(q for q in sample_puzzles(3, 50, seed=9) if any(s.kind == "backtrack" for s in cot_steps(q)[0]))
    steps, _ = cot_steps(p)
    back = next(s for s in steps if s.kind == "backtrack")
    x, y = p.names[back.person], p.names[back.witness]
    assert (f"We have exhausted all possibilities for {x}, so let us go back and reconsider {y}."
            in cot_trace(p))
    assert f"Back to {y}." in cot_trace(p, "compact")


def test_compact_is_shorter():
    for p in sample_puzzles(3, 20, seed=4):
        assert len(cot_trace(p, "compact").split()) < len(cot_trace(p, "full").split())


def test_errors():
    p = sample_puzzles(3, 1, seed=0)[0]
    with pytest.raises(ValueError, match="known styles"):
        cot_trace(p, "verbose")
    ambiguous = build_puzzle((("telling-truth", 0), ("telling-truth", 1)), (False, False),
                             ("Ann", "Bob"), [0, 0])
    with pytest.raises(ValueError, match="several consistent"):
        cot_trace(ambiguous)
    paradox = build_puzzle((("not", ("telling-truth", 0)), ("telling-truth", 1)), (True, True),
                           ("Ann", "Bob"), [0, 0])
    with pytest.raises(ValueError, match="no consistent"):
        cot_trace(paradox)
