"""Logical form: validation, safe parsing, the record literal, evaluation helpers."""

from __future__ import annotations

import pytest

from arlopti.tasks.kk.logic import (depth, evaluate, format_statements, mentioned_people, parse_statements,
                                    validate_statements)

OFFICIAL = ("(('not', ('telling-truth', 2)), ('or', ('telling-truth', 1), ('lying', 2)), "
            "('<=>', ('telling-truth', 1), ('lying', 1)))")


def test_parse_and_format_round_trip_official_literal():
    s = parse_statements(OFFICIAL, 3)
    assert s[0] == ("not", ("telling-truth", 2))
    assert format_statements(s) == OFFICIAL


def test_lists_become_tuples():
    s = validate_statements([["and", ["lying", 0], ["telling-truth", 1]], ["lying", 0]], 2)
    assert s == (("and", ("lying", 0), ("telling-truth", 1)), ("lying", 0))


@pytest.mark.parametrize("text, message", [
    ("__import__('os').system('true')", "not a Python literal"),
    ("(('telling-truth', 0),", "not a Python literal"),
    ("(('telling-truth', 0), ('lying', 5))", "person 5"),
    ("(('telling-truth', 0), ('maybe', 1))", "unknown operator 'maybe'"),
    ("(('telling-truth', 0), ('not', ('lying', 0), ('lying', 1)))", "operator 'not' has 2"),
    ("(('telling-truth', 0), ('and', ('lying', 0)))", "operator 'and' has 1"),
    ("(('telling-truth', 0), ('->', ('lying', 0), ('lying', 1), ('lying', 1)))", "operator '->' has 3"),
    ("(('telling-truth', True), ('lying', 1))", "not an int"),
    ("(('telling-truth', 0),)", "1 statements for 2 people"),
    ("{'a': 1}", "expected a tuple"),
    ("(" * 300 + ")" * 300, "statements"),
    ("x" * 200_000, "too long"),
])
def test_bad_literals_raise_value_error_naming_the_field(text, message):
    with pytest.raises(ValueError, match="statements") as err:
        parse_statements(text, 2)
    assert message in str(err.value)


def test_evaluate_operators():
    k = (True, False)
    assert evaluate(("telling-truth", 0), k) and evaluate(("lying", 1), k)
    assert not evaluate(("not", ("telling-truth", 0)), k)
    assert evaluate(("or", ("lying", 0), ("lying", 1)), k)
    assert not evaluate(("and", ("lying", 0), ("lying", 1)), k)
    assert evaluate(("->", ("lying", 0), ("telling-truth", 1)), k)  # false antecedent
    assert not evaluate(("->", ("telling-truth", 0), ("telling-truth", 1)), k)
    assert evaluate(("<=>", ("telling-truth", 1), ("lying", 0)), k)


def test_mentioned_people_and_depth():
    s = ("->", ("lying", 2), ("and", ("telling-truth", 0), ("lying", 2)))
    assert mentioned_people(s) == [2, 0]
    assert depth(("lying", 0)) == 1 and depth(s) == 3
