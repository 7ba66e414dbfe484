"""The official ``grade_answer_sympy`` (PRM800K grader). **Imported only inside grader worker processes.**

Restates, in our own code, the sympy half of the DeepScaleR / AR-Lopti math reward:
``grade_answer_sympy`` and its helpers in ``verl/utils/reward_score/rewards/math_utils/utils.py``
of zhyang2226/AR-Lopti (identical to ``deepscaler/rewards/math_utils/utils.py`` of
agentica-project/deepscaler). The original runs ``sympy.parsing.sympy_parser.parse_expr``
(which calls ``eval``) and ``sympy.simplify`` on model text with no timeout; here that only
happens in a :class:`~arlopti.tasks.math.pool.WorkerPool` process that is SIGKILLed at its
deadline, under a memory cap. Calling :func:`official_sympy_match` in the trainer process
on model output is unsafe: it may run for ever.

This file is loaded by path by ``_worker.py`` and must not import the ``arlopti`` package.
It needs sympy and pylatexenc (``latex2text``, the original's LaTeX-to-text step).
"""

from __future__ import annotations

import functools
import logging
import re

import sympy
from pylatexenc import latex2text
from sympy.parsing import sympy_parser

_WHOLE_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
          "month", "year", "foot", "feet", "inch", "yard")
_UNIT_PATTERNS = tuple(re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS)
_CIRC = re.compile(r"\^ *\\circ")
_THIN_SPACE_COMMA = re.compile(r",\\! *")
_MINUS_SPACES = re.compile(r"- *")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_THOUSANDS_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TUPLE_CHARS = "()[]"
_TRANSFORMATIONS = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
_LATEX_TO_TEXT = latex2text.LatexNodes2Text()
_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
# latex2text logs a warning for every macro it cannot render (e.g. \frac with one argument);
# a worker's stderr is the trainer's, so keep it quiet. The rendering itself is unchanged.
logging.getLogger("pylatexenc").setLevel(logging.CRITICAL)


# ---- number helpers ----------------------------------------------------------------------------
def _is_float(s: str) -> bool:
    """``_is_float``: ``float(s)`` succeeds (so "nan", "inf", " 5 ", "1_0" count)."""
    try:
        float(s)
    except ValueError:
        return False
    return True


def _is_int(x: float) -> bool:
    """``_is_int``: within 1e-7 of ``int(round(x))``; False when that fails (inf, nan)."""
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def strip_thousands_commas(s: str) -> str:
    """``_strip_properly_formatted_commas``: drop a comma between a digit and three digits that
    are followed by the end or a non-digit, repeatedly until nothing changes (``1,000,000`` ->
    ``1000000``; the tuple ``(1,2)`` and ``1,2345`` keep theirs)."""
    while True:
        out = _THOUSANDS_COMMA.sub(r"\1\3\4", s)
        if out == s:
            return out
        s = out


def str_is_int(s: str) -> bool:
    """``_str_is_int``: after :func:`strip_thousands_commas`, ``float()`` works and is integral
    within 1e-7 (any failure, including inf/nan, is False)."""
    try:
        x = float(strip_thousands_commas(s))
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def str_to_int(s: str) -> int:
    """``_str_to_int``: drop every comma, ``float()``, then ``int()`` (truncation, not rounding:
    "2.99999999" passes :func:`str_is_int` and becomes 2, as in the original)."""
    return int(float(s.replace(",", "")))


def is_frac(s: str) -> bool:
    """``_is_frac``: ``^-?[0-9]+.?/0*[1-9][0-9]*.?$`` (``.`` is any character, as written)."""
    return _FRACTION.search(s) is not None


# ---- the second normaliser ---------------------------------------------------------------------
def _latex_to_plain(expr: str) -> str:
    """``_parse_latex``: ``\\tfrac``/``\\dfrac`` -> ``\\frac``, a space before each ``\\frac``
    (mixed numbers), pylatexenc ``LatexNodes2Text().latex_to_text``, then the symbols ``√ π ∞ ∪ ·
    ×`` -> ``sqrt pi inf U * *``, and strip. (latex2text renders ``\\frac{a}{b}`` as ``a/b``
    without parentheses and ``\\sqrt{x}`` as ``√(x)``; we use the library itself, not a copy.)"""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = _LATEX_TO_TEXT.latex_to_text(expr)
    for symbol, word in _SYMBOLS:
        expr = expr.replace(symbol, word)
    return expr.strip()


@functools.lru_cache(maxsize=8192)
def normalize(expr: str) -> str:
    """The normalised form used by ``grade_answer_sympy`` (the original's ``_normalize``).

    Steps, in order: unwrap an answer that is wholly ``\\text{...}`` (no strip); ``\\%`` and
    ``\\$`` lose their backslash and then every ``$`` and ``%`` goes; " or " and " and " ->
    " , "; "million"/"billion"/"trillion" -> ``*10^6``/``*10^9``/``*10^12``; remove the unit
    words degree, cm, centimeter, meter, mile, second, minute, hour, day, week, month, year,
    foot, feet, inch, yard (each with optional "es"/"s", spaces and ``^digits``, anywhere in
    the string, even inside other words); remove ``^ \\circ``; drop one pair of outer braces;
    remove ``,\\!`` and following spaces; a float-parsable integral value becomes
    ``str(int(round(x)))``; when a backslash remains, :func:`_latex_to_plain` (any exception
    there leaves the string as it was); "- " -> "-"; "7 3/4" -> "7+3/4"; drop spaces and
    braces; lower-case; an integer string (see :func:`str_is_int`) becomes
    ``str(str_to_int(s))``.
    """
    m = _WHOLE_TEXT.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for pattern in _UNIT_PATTERNS:
        expr = pattern.sub("", expr)
    expr = _CIRC.sub("", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = _THIN_SPACE_COMMA.sub("", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_plain(expr)
        except Exception:  # noqa: BLE001  (the original's bare except)
            pass
    expr = _MINUS_SPACES.sub("-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if str_is_int(expr):
        expr = str(str_to_int(expr))
    return expr


# ---- tuples, refusals, sympy -------------------------------------------------------------------
def split_tuple(expr: str) -> list[str]:
    """``split_tuple``: after :func:`strip_thousands_commas`, an expression longer than 2
    characters that starts and ends with one of ``()[]`` and has none of them inside is split
    on commas (items stripped); anything else is one item; "" gives no items."""
    expr = strip_thousands_commas(expr)
    if len(expr) == 0:
        return []
    if (len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
            and all(ch not in expr[1:-1] for ch in _TUPLE_CHARS)):
        return [item.strip() for item in expr[1:-1].split(",")]
    return [expr]


def count_unknown_letters(expr: str) -> int:
    """``count_unknown_letters_in_expr``: distinct ``isalpha`` characters once "sqrt" and
    "frac" are removed (so ``pi`` counts two letters)."""
    expr = expr.replace("sqrt", "").replace("frac", "")
    return len({c for c in expr if c.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """``should_allow_eval``: refuse more than 2 unknown letters, the substrings ``^{`` and
    ``^(``, a chained numeric power ``^digits^`` and a multi-digit exponent ``^dd``. (On
    normalised input ``^{`` cannot occur, since :func:`normalize` drops braces; the rule is kept.)"""
    if count_unknown_letters(expr) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(p.search(expr) for p in _BAD_REGEXES)


def _sympy_parse(expr: str):
    """``_sympy_parse``: ``^`` -> ``**``, then ``parse_expr`` with the standard transformations
    plus implicit multiplication/application (``2x``, ``2sqrt(2)``, ``sin x``)."""
    return sympy_parser.parse_expr(expr.replace("^", "**"), transformations=_TRANSFORMATIONS)


class _Guarded(Exception):
    """Our guard refused a sympy step that the original would have run."""


def equal_under_sympy(gold: str, given: str, allow_simplify: bool = True) -> bool:
    """``are_equal_under_sympy``: ``simplify(parse("(gold)-(given)")) == 0``, only when
    :func:`should_allow_eval` accepts that expression; any exception is False.

    ``allow_simplify=False`` (ours) is how our in-process guards
    (:func:`~arlopti.tasks.math.guards.symbolic_risk`) stop the sympy step: it raises
    :class:`_Guarded` when the original would have parsed and simplified.
    """
    expr = f"({gold})-({given})"
    if not should_allow_eval(expr):
        return False
    if not allow_simplify:
        raise _Guarded
    try:
        return bool(sympy.simplify(_sympy_parse(expr)) == 0)
    except Exception:  # noqa: BLE001  (the original's bare except)
        return False


def grade_sympy(given: str, gold: str, allow_simplify: bool = True) -> bool:
    """``grade_answer_sympy(given_answer, ground_truth)``.

    Both sides are :func:`normalize`d. Equal strings -> True; an empty answer -> False. Then
    both are split by :func:`split_tuple`: when the gold has more than one item, the first and
    last characters (the brackets) of the two normalised strings must agree; the item counts
    must agree; then item by item (stopping at the first failure): two fractions ``a/b``
    (:func:`is_frac`) must be identical strings (an unreduced fraction is wrong); when exactly
    one of the two is an integer (:func:`str_is_int`) the item is wrong (an integer gold needs
    an integer answer); otherwise :func:`equal_under_sympy`.
    """
    gold_n, given_n = normalize(gold), normalize(given)
    if gold_n == given_n:
        return True
    if len(given_n) == 0:
        return False
    gold_items, given_items = split_tuple(gold_n), split_tuple(given_n)
    if len(gold_items) > 1 and (gold_n[0] != given_n[0] or gold_n[-1] != given_n[-1]):
        return False
    if len(gold_items) != len(given_items):
        return False
    for g, p in zip(gold_items, given_items):
        if is_frac(g) and is_frac(p):
            ok = g == p
        elif str_is_int(g) != str_is_int(p):
            ok = False
        else:
            ok = equal_under_sympy(g, p, allow_simplify)
        if not ok:
            return False
    return True


def official_sympy_match(pred: str, golds: tuple[str, ...], allow_simplify: bool = True) -> int:
    """Index of the first gold that :func:`grade_sympy` accepts for ``pred``; -1 for none.

    -2 (ours): none matched, and for at least one gold our guard (``allow_simplify=False``)
    skipped a sympy step the original would have run.
    """
    guarded = False
    for i, gold in enumerate(golds):
        try:
            if grade_sympy(pred, gold, allow_simplify):
                return i
        except _Guarded:
            guarded = True
    return -2 if guarded else -1
