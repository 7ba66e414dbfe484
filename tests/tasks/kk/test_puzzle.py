"""Puzzle records: official schema in and out, round trips, and clear errors for bad records."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import need_fixture

from arlopti.tasks.kk.generator import sample_puzzles
from arlopti.tasks.kk.puzzle import Puzzle

FIELDS = ("quiz", "names", "solution", "solution_text", "solution_text_format", "statements", "index",
          "n_people")


def official_records(n=3):
    path = need_fixture(f"kk/kk_test_{n}ppl.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def good_record():
    return sample_puzzles(3, 1, seed=0)[0].to_record()


def test_official_records_round_trip():
    for n in (3, 7):
        for r in official_records(n):
            p = Puzzle.from_record(r, verify=True)
            assert p.names == tuple(r["names"]) and p.solution == tuple(r["solution"])
            back = p.to_record()
            for f in FIELDS + ("prompt",):
                assert back[f] == r[f], f  # statements literal and the official prompt are byte-identical
            assert p.prompt == r["prompt"]
            assert Puzzle.from_record(back) == p


def test_generated_puzzles_round_trip_through_json():
    for n in (2, 5, 12):
        for p in sample_puzzles(n, 5, seed=1):
            assert p.prompt is None and "prompt" not in p.to_record()
            assert Puzzle.from_record(json.loads(json.dumps(p.to_record()))) == p


def test_statements_may_be_nested_lists():
    r = good_record()
    p = Puzzle.from_record(r)
    r["statements"] = json.loads(json.dumps(p.statements))  # tuples -> lists
    assert Puzzle.from_record(r).statements == p.statements


def test_missing_solution_text_is_derived():
    r = good_record()
    p = Puzzle.from_record(r)
    del r["solution_text"], r["index"], r["n_people"]
    q = Puzzle.from_record(r)
    assert q.solution_text == p.solution_text and q.index is None


def mutate(key, value):
    r = good_record()
    if value is KeyError:
        del r[key]
    else:
        r[key] = value
    return r


@pytest.mark.parametrize("record, field, message", [
    (mutate("names", KeyError), "names", "missing"),
    (mutate("names", "Emma"), "names", "expected list or tuple"),
    (mutate("names", ["Emma", "Emma", "Liam"]), "names", "repeated"),
    (mutate("names", ["Emma", "Mary Ann", "Liam"]), "names", "ASCII letters"),
    (mutate("names", ["Emma", "Knightley", "Liam"]), "names", "knight"),
    (mutate("names", []), "names", "0 names"),
    (mutate("solution", [True, False]), "solution", "expected 3 booleans"),
    (mutate("solution", [1, 0, 1]), "solution", "expected 3 booleans"),
    (mutate("statements", "(('lying', 0),)"), "statements", "1 statements for 3 people"),
    (mutate("statements", "os.system('x')"), "statements", "not a Python literal"),
    (mutate("statements", 5), "statements", "expected str or list or tuple"),
    (mutate("quiz", ""), "quiz", "empty"),
    (mutate("quiz", None), "quiz", "expected str"),
    (mutate("solution_text_format", "nothing here"), "solution_text_format", "no '(k) NAME"),
    (mutate("n_people", 4), "n_people", "3 names"),
    (mutate("index", "7"), "index", "expected an int"),
    (mutate("prompt", 7), "prompt", "expected str"),
    (mutate("prompt", "<|im_start|>user\nanother puzzle<|im_end|>\n<think>"), "prompt", "'quiz' verbatim"),
])
def test_bad_records_name_source_and_field(record, field, message):
    with pytest.raises(ValueError) as err:
        Puzzle.from_record(record, source="data/x.jsonl:17")
    text = str(err.value)
    assert text.startswith("data/x.jsonl:17: ")
    assert f"'{field}'" in text and message in text, text


def test_gold_text_must_agree_with_solution():
    r = good_record()
    r["solution"] = [not x for x in r["solution"]]
    with pytest.raises(ValueError, match="'solution_text_format' says"):
        Puzzle.from_record(r)


def test_verify_rejects_a_wrong_but_self_consistent_record():
    r = copy.deepcopy(good_record())
    p = Puzzle.from_record(r)
    flipped = tuple(not x for x in p.solution)
    from arlopti.tasks.kk.render import solution_text, solution_text_format

    r["solution"] = list(flipped)
    r["solution_text_format"] = solution_text_format(p.names, flipped)
    r["solution_text"] = solution_text(p.names, flipped)
    Puzzle.from_record(r)  # shape is fine
    with pytest.raises(ValueError, match="'solution'.*consistent assignment"):
        Puzzle.from_record(r, source="f.jsonl:2", verify=True)


def test_not_a_mapping():
    with pytest.raises(ValueError, match="JSON object"):
        Puzzle.from_record(["quiz"], source="f.jsonl:1")
