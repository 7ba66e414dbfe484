"""The official DeepScaleR / AR-Lopti math reward, in-process part: text selection, answer, golds, mathd.

This module restates, in our own code, the reward that AR-Lopti uses for its math runs
(DSR-Uniform, ORZ). Sources (read at the commits mirrored for this project; the two
``utils.py`` files are identical):

* ``verl/utils/reward_score/rewards/math_reward.py`` in zhyang2226/AR-Lopti, class
  ``RewardMathFn.__call__`` (adapted from agentica-project/deepscaler
  ``deepscaler/rewards/math_reward.py``; AR-Lopti drops DeepScaleR's "no ``<think>`` ...
  ``</think>`` pair -> format error" rule and keeps the rest);
* ``verl/utils/reward_score/rewards/math_utils/utils.py`` in zhyang2226/AR-Lopti (=
  ``deepscaler/rewards/math_utils/utils.py`` in agentica-project/deepscaler): the Hendrycks
  MATH normaliser and the PRM800K sympy grader.

The reward of one response is 1 when the last boxed answer passes ``grade_answer_mathd`` or
``grade_answer_sympy`` against any gold, else 0. Everything here is plain string work that is
safe in the calling process; the sympy half (which also needs pylatexenc) is in
:mod:`arlopti.tasks.math.official_sympy` and runs only in the grader's worker processes.

Where our grader departs from the original on purpose, :mod:`arlopti.tasks.math.grader`
says so (size caps and guards, the response-only input).
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from arlopti.tasks.math.braces import closing_brace

THINK_END = "</think>"
_BOXED = "\\boxed"
_FBOX = "\\fbox"
_BOXED_OPEN = "\\boxed{"
# An answer wrapped whole in \text{...}: the same pattern in mathd_normalize_answer and _normalize.
_WHOLE_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
# Shortcut (ours) for two plain integers; 15 digits keep every value exact as a float.
_PLAIN_INT = re.compile(r"-?[0-9]{1,15}(?:\.0+)?", re.ASCII)


# ---- which text is graded ----------------------------------------------------------------------
def solution_text(text: str) -> str:
    """The part of a response the official reward looks at.

    Restates ``RewardMathFn.__call__`` in AR-Lopti ``rewards/math_reward.py``: when
    ``</think>`` occurs, the text is ``text.split("</think>")[1]``, i.e. what lies between the
    first and the second ``</think>`` (everything after the first one when there is only one);
    without ``</think>`` the whole text is kept, with no format penalty.
    """
    if THINK_END not in text:
        return text
    return text.split(THINK_END, 2)[1]


# ---- the answer --------------------------------------------------------------------------------
def last_boxed_only(text: str) -> str | None:
    """The last box command with its argument, e.g. ``"\\boxed{1}"``, or None.

    Restates ``last_boxed_only_string`` in ``math_utils/utils.py``: start at the last
    ``\\boxed`` (only when there is none, at the last ``\\fbox``; none of either -> None). From
    that backslash on, count braces: ``{`` adds one, ``}`` subtracts one, and the first ``}``
    that brings the count back to exactly 0 closes the box. The result runs from the command
    to that brace; with no such brace it is None. Nothing checks what follows the command
    name, so ``\\boxed 7 {x}`` gives ``"\\boxed 7 {x}"`` (which :func:`remove_boxed` then
    refuses) and ``\\boxed 7`` with no brace after it gives None.
    """
    start = text.rfind(_BOXED)
    if start < 0:
        start = text.rfind(_FBOX)
        if start < 0:
            return None
    end = closing_brace(text, start)  # the same count as upstream, scanned from the backslash
    return None if end is None else text[start:end + 1]


def remove_boxed(boxed: str | None) -> str | None:
    """The argument of a ``\\boxed{...}`` string, or None.

    Restates ``remove_boxed`` in ``math_utils/utils.py``: the string must start with exactly
    ``\\boxed{`` and end with ``}``; anything else (``\\fbox{7}``, ``\\boxed 7 {x}``, None)
    gives None.
    """
    if boxed is None or not boxed.startswith(_BOXED_OPEN) or not boxed.endswith("}"):
        return None
    return boxed[len(_BOXED_OPEN):-1]


def extract_answer(passage: str) -> str | None:
    """The official final answer of ``passage``: the content of its last ``\\boxed{...}``.

    Restates ``extract_answer`` and ``extract_boxed_answer`` in ``math_utils/utils.py``: None
    unless ``\\boxed`` occurs somewhere; otherwise :func:`remove_boxed` of
    :func:`last_boxed_only`. Consequences: ``\\fbox`` is never used (with no ``\\boxed`` the
    answer is None; with one, the last ``\\boxed`` wins), ``\\boxed 7`` gives None, an empty
    ``\\boxed{}`` gives ``""``, and an unclosed last ``\\boxed{`` gives None even when an
    earlier box was closed.
    """
    if _BOXED not in passage:
        return None
    return remove_boxed(last_boxed_only(passage))


# ---- the golds ---------------------------------------------------------------------------------
def _gold_item(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise TypeError(f"a gold answer must be a str, int or float, got {type(value).__name__}: "
                        f"{value!r:.80}")
    return value if isinstance(value, str) else str(value)


def official_golds(ground_truth: Any) -> tuple[str, ...]:
    """The gold answers as the official reward prepares them (a match with any one counts).

    Restates the ground-truth block of ``RewardMathFn.__call__`` in ``rewards/math_reward.py``:
    a str/int/float gold becomes a one-item list; each item becomes ``str(item)`` (no
    stripping: an int 142 is ``"142"``, a float 142.0 is ``"142.0"``); an item containing
    ``\\boxed`` is replaced by :func:`extract_answer` of it and dropped when that is None. The
    result may be empty (the official reward then gives 0; we report ``how="no_gold"``).

    Ours, not the original's: bools, None, dicts, nested lists and an empty list raise
    TypeError (the original would grade ``str()`` of them or give 0); these are data bugs.
    """
    if isinstance(ground_truth, (list, tuple)):
        if not ground_truth:
            raise TypeError("a gold answer list is empty")
        items = [_gold_item(g) for g in ground_truth]
    else:
        items = [_gold_item(ground_truth)]
    out = []
    for item in items:
        if _BOXED in item:
            inner = extract_answer(item)
            if inner is not None:
                out.append(inner)
        else:
            out.append(item)
    return tuple(out)


# ---- grade_answer_mathd ------------------------------------------------------------------------
def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``.

    Restates ``_strip_string._fix_fracs`` in ``math_utils/utils.py``: split on ``\\frac``; a
    piece starting with ``{`` is kept; otherwise its first character is braced and so is the
    second unless it is ``{``; a piece of one character makes the whole input come back
    unchanged; an empty piece (``\\frac`` at the very end) raises IndexError, which
    :func:`mathd_normalize` turns into "use the un-normalised answer", as the original does.
    """
    pieces = s.split("\\frac")
    out = [pieces[0]]
    for piece in pieces[1:]:
        out.append("\\frac")
        if piece[0] == "{":  # IndexError on "" on purpose (see docstring)
            out.append(piece)
            continue
        if len(piece) < 2:
            return s
        a, b, rest = piece[0], piece[1], piece[2:]
        out.append("{" + a + "}" + (b if b == "{" else "{" + b + "}") + rest)
    return "".join(out)


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when the string is exactly two Python ints around one ``/``.

    Restates ``_strip_string._fix_a_slash_b``: exactly one ``/``; both sides must go through
    ``int()`` and print back to the same string (so ``03/4`` or ``+3/4`` stay as they are,
    ``-3/4`` becomes ``\\frac{-3}{4}``).
    """
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    if s != f"{a}/{b}":
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(s: str) -> str:
    """Cut a unit written as ``\\text{ ...}`` (with the space) and what follows it.

    Restates ``_strip_string._remove_right_units``: when ``\\text{ `` occurs, the string must
    split into exactly two parts on it (else AssertionError, i.e. the un-normalised answer is
    used) and the part before it is kept.
    """
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise AssertionError("\\text{ occurs more than once")
    return parts[0]


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``: only the one character after ``\\sqrt`` is braced.

    Restates ``_strip_string._fix_sqrt``; an empty piece (``\\sqrt`` at the end, or
    ``\\sqrt\\sqrt``) raises IndexError as in the original.
    """
    if "\\sqrt" not in s:
        return s
    pieces = s.split("\\sqrt")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if piece[0] != "{":  # IndexError on "" on purpose
            out.append("\\sqrt{" + piece[0] + "}" + piece[1:])
        else:
            out.append("\\sqrt" + piece)
    return "".join(out)


def _strip_string(s: str) -> str:
    """Hendrycks' MATH ``_strip_string``, step by step as in ``math_utils/utils.py``.

    Order: drop newlines; drop ``\\!``; ``\\\\`` -> ``\\``; ``tfrac``/``dfrac`` -> ``frac``;
    drop ``\\left`` and ``\\right``; drop ``^{\\circ}`` and ``^\\circ``; drop ``\\$``;
    :func:`_remove_right_units`; drop ``\\%``; " ." -> " 0." and "{." -> "{0."; an empty
    string stops here; a leading "." gets a "0"; when there is exactly one ``=`` and at most two
    characters before it, keep what follows it; :func:`_fix_sqrt`; drop spaces;
    :func:`_fix_fracs`; ``"0.5"`` -> ``\\frac{1}{2}``; :func:`_fix_a_slash_b`.
    """
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def mathd_normalize(answer: str) -> str:
    """The normalised form used by ``grade_answer_mathd``.

    Restates ``mathd_normalize_answer`` in ``math_utils/utils.py``: strip surrounding
    whitespace; when the whole answer matches ``^\\text\\{(.+?)\\}$`` keep the (stripped)
    group; then :func:`_strip_string`. If any step raises, the answer as it was after the
    ``\\text`` step is returned un-normalised (the original's bare ``except``).
    """
    answer = answer.strip()
    try:
        m = _WHOLE_TEXT.search(answer)
        if m is not None:
            answer = m.group("text").strip()
        return _strip_string(answer)
    except Exception:  # noqa: BLE001  (the original catches everything)
        return answer


def grade_mathd(given: str, gold: str) -> bool:
    """``grade_answer_mathd`` in ``math_utils/utils.py``: equal :func:`mathd_normalize` strings."""
    return mathd_normalize(gold) == mathd_normalize(given)


# ---- a shortcut of ours ------------------------------------------------------------------------
def plain_int_verdict(given: str, gold: str) -> bool | None:
    """The official verdict for two plain integers, decided without sympy; None otherwise.

    Not in the original: an in-process shortcut that saves a worker round trip. It applies
    only when both strings are ``-?digits`` (1 to 15 ASCII digits, so exact as floats)
    optionally followed by ``.0...``. For such strings ``grade_answer_mathd`` is string
    equality, and ``grade_answer_sympy``'s ``_normalize`` maps each to ``str(int(x))``, after
    which it either finds the strings equal or hands two integers to ``sympy.simplify``, whose
    difference is a nonzero integer: so the verdict is exactly "same integer value".
    """
    if not (_PLAIN_INT.fullmatch(given) and _PLAIN_INT.fullmatch(gold)):
        return None
    return int(float(given)) == int(float(gold))
