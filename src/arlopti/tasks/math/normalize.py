"""String normalisation of math answers (Hendrycks MATH style) and gold-answer preparation.

:func:`normalize_answer` is the in-process fast path of the grader: two answers whose
normalised strings are equal are a match without any symbolic work. Every step is a plain
string operation or a regex without nested quantifiers, so the cost is linear in the length.

It follows Hendrycks et al.'s ``strip_string`` (the ``grade_answer_mathd`` path of the
DeepScaleR / AR-Lopti reward) step by step, with a few additions marked "(added)".
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction
from typing import Any

from arlopti.tasks.math.extract import unwrap_boxed

# \text{...}, \textbf{...}, \mbox{...}, \mathrm{...} whose argument holds no braces.
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf)\{([^{}]*)\}")
_SLASH_FRACTION = re.compile(r"-?(?:0|[1-9][0-9]*)/(?:0|[1-9][0-9]*)")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?")
_MAX_NUMBER_CHARS = 200


def _remove_right_units(s: str) -> str:
    """Drop a unit written as ``\\text{ ...}`` (note the space) and everything after it."""
    head, sep, _ = s.partition("\\text{ ")
    return head if sep and head.strip() else s


def _fix_sqrt(s: str) -> str:
    """``\\sqrt2`` -> ``\\sqrt{2}`` (only the single character after ``\\sqrt`` is wrapped)."""
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = [parts[0]]
    for part in parts[1:]:
        if part and part[0] not in "{[\\ ":
            part = "{" + part[0] + "}" + part[1:]
        out.append(part)
    return "\\sqrt".join(out)


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{7}`` -> ``\\frac{1}{7}``; malformed input unchanged."""
    if "\\frac" not in s:
        return s
    parts = s.split("\\frac")
    out = [parts[0]]
    for part in parts[1:]:
        if part.startswith("{"):
            out.append(part)
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        if b == "{":
            out.append("{" + a + "}{" + rest)
        else:
            out.append("{" + a + "}{" + b + "}" + rest)
    return "\\frac".join(out)


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when the whole string is an integer over an integer."""
    if _SLASH_FRACTION.fullmatch(s):
        a, b = s.split("/")
        return "\\frac{" + a + "}{" + b + "}"
    return s


def normalize_answer(answer: str) -> str:
    """Hendrycks MATH normalisation of one answer string.

    Steps, in order: strip whitespace and surrounding ``$`` (added); unwrap ``\\text{...}`` and
    similar when it is the whole answer; drop newlines, ``\\!`` and the thin spaces ``\\,``
    ``\\;`` ``\\:`` (added); ``\\\\`` -> ``\\``; ``tfrac``/``dfrac`` -> ``frac``; drop ``\\left``,
    ``\\right``, ``\\displaystyle`` (added); drop degrees ``^{\\circ}``, ``^\\circ`` and ``°``
    (added); drop ``\\$``; drop units given as ``\\text{ ...}``; drop ``\\%`` and ``%``; unwrap
    any remaining ``\\text{...}``-style wrappers (added); " ." -> " 0.", "{." -> "{0.", a
    leading "." gets a "0"; drop a prefix "v =" whose left side has at most 2 characters; fix
    ``\\sqrt2``; remove spaces; fix ``\\frac12``; "0.5" -> ``\\frac{1}{2}``; "a/b" ->
    ``\\frac{a}{b}``; drop one trailing "." (added).
    """
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s.strip("$").strip()
    whole_text = _TEXT_WRAPPER.fullmatch(s)
    if whole_text:
        s = whole_text.group(1)
    for junk in ("\n", "\\!", "\\,", "\\;", "\\:"):
        s = s.replace(junk, "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = _TEXT_WRAPPER.sub(r"\1", s)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs) <= 2:
        s = rhs
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    if s.endswith(".") and len(s) > 1:
        s = s[:-1]
    return s


def plain_number(normalized: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain decimal number, else None.

    Accepts an optional sign, digits with an optional decimal part, and thousands separators in
    the proper ``1,234,567`` form. No exponents, so the value is computed in linear time.
    """
    s = normalized
    if len(s) > _MAX_NUMBER_CHARS:
        return None
    if "," in s and _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    return Fraction(s)


def gold_to_string(value: Any) -> str:
    """One gold item as a string: integral floats become integers (``142.0`` -> ``"142"``).

    Strings are stripped and unwrapped from ``\\boxed{...}``. Raises TypeError for anything
    that is not a str, int or float (bools included).
    """
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise TypeError(f"a gold answer must be a str, int or float, got {type(value).__name__}: "
                        f"{value!r:.80}")
    if isinstance(value, str):
        return unwrap_boxed(value.strip()).strip()
    if isinstance(value, numbers.Integral):
        return str(int(value))
    x = float(value)
    if math.isfinite(x) and x.is_integer():
        return str(int(x))
    return repr(x)


def gold_strings(ground_truth: Any) -> tuple[str, ...]:
    """All accepted gold answers as strings; a list/tuple gold means "any of these".

    Raises TypeError for an unsupported type, a nested list, or an empty list.
    """
    if isinstance(ground_truth, (list, tuple)):
        if not ground_truth:
            raise TypeError("a gold answer list is empty")
        out = []
        for item in ground_truth:
            if isinstance(item, (list, tuple, dict)):
                raise TypeError("a gold answer list must hold str/int/float, got a nested "
                                f"{type(item).__name__}")
            out.append(gold_to_string(item))
        return tuple(out)
    return (gold_to_string(ground_truth),)
