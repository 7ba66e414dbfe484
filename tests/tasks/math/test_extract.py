"""Answer extraction: </think> handling, tail cap, last boxed with brace counting."""

import pytest

from arlopti.tasks.math.extract import cap_tail, last_boxed, strip_think, unwrap_boxed


def test_strip_think_modes():
    text = "reason </think> middle \\boxed{1} </think> tail \\boxed{2}"
    assert strip_think(text) == " middle \\boxed{1} </think> tail \\boxed{2}"
    assert strip_think(text, "official") == " middle \\boxed{1} "
    assert strip_think("no think here") == "no think here"
    with pytest.raises(ValueError, match="after_first"):
        strip_think("x", "last")


def test_cap_tail_keeps_the_end():
    assert cap_tail("abcdef", 3) == "def"
    assert cap_tail("ab", 3) == "ab"


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{42}.", "42"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("nested \\boxed{\\left\\{ \\frac{a}{b} \\right\\}}", "\\left\\{ \\frac{a}{b} \\right\\}"),
    ("\\fbox{7}", "7"),
    ("\\boxed{1} and \\fbox{8}", "8"),
    ("\\boxed 5 is it", "5"),
    ("$\\boxed 12$", "12"),
    ("\\boxed{3} then \\boxed{4", None),  # the last box is unclosed: official behaviour, no answer
    ("no box", None),
    ("\\boxedx", None),
    ("\\boxed{}", ""),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_deep_nesting_is_linear_and_exact():
    inner = "{" * 10_000 + "x" + "}" * 10_000
    assert last_boxed("\\boxed{" + inner + "}") == inner


def test_unwrap_boxed():
    assert unwrap_boxed("\\boxed{12}") == "12"
    assert unwrap_boxed("12") == "12"
    assert unwrap_boxed("\\boxed{12") == "\\boxed{12"
