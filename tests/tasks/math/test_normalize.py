"""Hendrycks normalisation, plain-number parsing and gold preparation."""

from fractions import Fraction

import pytest

from arlopti.tasks.math.normalize import gold_strings, gold_to_string, normalize_answer, plain_number


@pytest.mark.parametrize("raw, expected", [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac12", "\\frac{1}{2}"),
    ("\\frac1{72}", "\\frac{1}{72}"),
    ("0.5", "\\frac{1}{2}"),
    ("3/4", "\\frac{3}{4}"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("\\$5", "5"),
    ("50\\%", "50"),
    ("5 \\text{ cm}", "5"),
    ("\\text{even}", "even"),
    ("x = 3", "3"),
    ("xyz = 3", "xyz=3"),  # the left side is too long to be a variable name
    (".5", "\\frac{1}{2}"),
    ("$7$", "7"),
    ("1\\,000", "1000"),
    ("12.", "12"),
    ("", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_plain_number():
    assert plain_number("055") == 55
    assert plain_number("-1.50") == Fraction(-3, 2)
    assert plain_number("1,234,567") == 1234567
    assert plain_number("1,2") is None  # a pair, not a thousands separator
    assert plain_number("1e5") is None
    assert plain_number("\\frac{1}{2}") is None
    assert plain_number("9" * 500) is None  # too long for the fast path


def test_gold_strings():
    assert gold_to_string(142.0) == "142"
    assert gold_to_string(0.25) == "0.25"
    assert gold_to_string(7) == "7"
    assert gold_to_string(" \\boxed{12} ") == "12"
    assert gold_strings(["9.6\n", 3.0]) == ("9.6", "3")
    for bad in (True, None, {"a": 1}, [], [["x"]]):
        with pytest.raises(TypeError):
            gold_strings(bad)


def test_in_process_steps_never_raise_on_random_latex():
    import random

    from arlopti.tasks.math.extract import last_boxed, strip_think
    from arlopti.tasks.math.guards import symbolic_risk

    tokens = ["\\boxed{", "\\fbox{", "{", "}", "\\frac", "\\sqrt", "^", "_", "=", "/", ".", ",", " ", "$",
              "\\text{", "\\text{ ", "\\left(", "\\right)", "1", "23", "x", "\\%", "^\\circ", "</think>",
              "!", "**", "\\\\", "\n", "é", "\ud800", "0.5", "-"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 40)))
        box = last_boxed(strip_think(text))
        for s in (text, box or ""):
            norm = normalize_answer(s)
            assert isinstance(norm, str)
            plain_number(norm)
            assert symbolic_risk(s) in (None, "too_long", "power_tower", "huge_exponent", "huge_factorial")
