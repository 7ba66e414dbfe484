"""Cheap checks that keep obviously explosive answers away from sympy.

The hard timeout in the worker pool is what guarantees the grader never hangs; these guards
only save the time a doomed symbolic check would burn before being killed. They are pure
string scans, run in-process on the extracted answer (already capped in length).
"""

from __future__ import annotations

import re

MAX_ANSWER_CHARS = 1000
# A literal exponent with more digits than this is refused (2^{99999} is fine, 2^{999999} not).
MAX_EXPONENT_DIGITS = 5
_BIG_FACTORIAL = re.compile(r"[0-9]{4,}\s*!")
_DIGIT_RUN = re.compile(r"[0-9]+")


def _exponent_at(s: str, i: int) -> tuple[str, int]:
    """The exponent that starts at ``s[i]`` (just after ``^`` or ``**``) and the index after it.

    ``{...}`` and ``(...)`` groups are matched by counting; otherwise the exponent is a run of
    digits, a ``\\command``, or a single character.
    """
    n = len(s)
    while i < n and s[i] == " ":
        i += 1
    if i >= n:
        return "", i
    if s[i] in "{(":
        open_c, close_c = s[i], "}" if s[i] == "{" else ")"
        depth = 0
        for j in range(i, n):
            if s[j] == open_c:
                depth += 1
            elif s[j] == close_c:
                depth -= 1
                if depth == 0:
                    return s[i + 1:j], j + 1
        return s[i + 1:], n  # unclosed: the rest is the exponent
    if s[i].isdigit():
        j = i
        while j < n and s[j].isdigit():
            j += 1
        return s[i:j], j
    if s[i] == "\\":
        j = i + 1
        while j < n and s[j].isalpha():
            j += 1
        return s[i:j], j
    return s[i], i + 1


def symbolic_risk(answer: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Why ``answer`` must not go to the symbolic check, or None when it may.

    Reasons: ``"too_long"`` (over ``max_chars``), ``"power_tower"`` (an exponent that holds
    another exponent, or chained ``a^b^c``), ``"huge_exponent"`` (a literal exponent with more
    than :data:`MAX_EXPONENT_DIGITS` digits), ``"huge_factorial"`` (``n!`` with n >= 1000).
    """
    if len(answer) > max_chars:
        return "too_long"
    if _BIG_FACTORIAL.search(answer):
        return "huge_factorial"
    s = answer.replace("**", "^")
    i = s.find("^")
    while i >= 0:
        exponent, end = _exponent_at(s, i + 1)
        if "^" in exponent or "\\uparrow" in exponent:
            return "power_tower"
        if any(len(run) > MAX_EXPONENT_DIGITS for run in _DIGIT_RUN.findall(exponent)):
            return "huge_exponent"
        j = end
        while j < len(s) and s[j] == " ":
            j += 1
        if j < len(s) and s[j] == "^":
            return "power_tower"  # a^b^c without braces
        i = s.find("^", end)
    return None
