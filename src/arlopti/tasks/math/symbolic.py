"""The symbolic equivalence check. **Imported only inside grader worker processes.**

It uses math-verify (``parse`` + ``verify``, which build on sympy and latex2sympy2_extended)
with math-verify's own signal-based timeouts switched off (``parsing_timeout=None``,
``timeout_seconds=None``): signals cannot interrupt C-level big-integer work, so the only
timeout that counts is the worker pool killing this process. Importing this module in the
trainer process is harmless, but calling :func:`symbolic_match` there on model text is not:
it may run for ever. Use :class:`arlopti.tasks.math.grader.MathGrader`.
"""

from __future__ import annotations

import functools
import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# math-verify warns once per process that its timeouts are off; that is deliberate here.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
# "3.3e12": latex parsing would read the "e" as Euler's number.
_SCIENTIFIC = re.compile(r"([-+]?[0-9]+(?:\.[0-9]*)?)[eE]([-+]?[0-9]{1,4})")


def _prepare(answer: str) -> str:
    """Wrap an answer for math-verify: strip ``$``, rewrite scientific notation, add ``$...$``."""
    s = answer.strip().strip("$").strip()
    m = _SCIENTIFIC.fullmatch(s)
    if m:
        s = f"{m.group(1)}\\times 10^{{{m.group(2)}}}"
    return "$" + s + "$"


def _parse(answer: str) -> list:
    return parse(_prepare(answer), extraction_config=_EXTRACTION, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Golds repeat across the k samples of a prompt; parse each once per worker.
    return tuple(_parse(gold))


def symbolic_match(pred: str, golds: tuple[str, ...]) -> int:
    """Index of the first gold that math-verify finds equivalent to ``pred``; -1 for none.

    Argument order follows math-verify: gold first (``verify`` is not symmetric).
    """
    parsed = _parse(pred)
    if not parsed:
        return -1
    for i, gold in enumerate(golds):
        gold_parsed = list(_parse_gold(gold))
        if gold_parsed and verify(gold_parsed, parsed, timeout_seconds=None):
            return i
    return -1
