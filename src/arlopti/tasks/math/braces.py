"""Brace matching shared by both math answer extractors (extract.py and official.py)."""

from __future__ import annotations


def closing_brace(text: str, start: int) -> int | None:
    """Index of the first ``}`` at or after ``start`` that brings the brace count back to exactly 0.

    The count starts at 0 at ``start``; ``{`` adds one and ``}`` subtracts one. A ``}`` seen before
    any ``{`` takes the count below 0, and the count must then climb back before a later ``}`` can
    close. None when no brace closes. This is the scan of the official ``last_boxed_only_string``
    (DeepScaleR ``math_utils``) and of our own :func:`~arlopti.tasks.math.extract.last_boxed`.
    """
    depth = 0
    for j in range(start, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return None
