"""Find the final answer in a response: the ``</think>`` split, the size cap, the last ``\\boxed``.

All functions here are pure string operations that run in linear time in the input length,
so they are safe to run in the calling process on any model output.
"""

from __future__ import annotations

from arlopti.tasks.math.braces import closing_brace

THINK_CLOSE = "</think>"
THINK_MODES = ("after_first", "official")
# The response is cut to its last MAX_RESPONSE_CHARS characters before anything else; the final
# answer lives at the end, and the cap bounds the cost of every later step.
MAX_RESPONSE_CHARS = 65_536


def strip_think(text: str, mode: str = "after_first") -> str:
    """Drop the reasoning block: the text up to and including the first ``</think>``.

    ``mode="after_first"`` (default) keeps everything after the first ``</think>``.
    ``mode="official"`` keeps only the text between the first and the second ``</think>``
    (``text.split("</think>")[1]``, as in DeepScaleR/AR-Lopti). The two differ only when a
    response closes ``</think>`` more than once. Text without ``</think>`` is returned unchanged.
    """
    if mode not in THINK_MODES:
        raise ValueError(f"think mode {mode!r} is unknown; use one of {THINK_MODES}")
    first = text.find(THINK_CLOSE)
    if first < 0:
        return text
    rest = text[first + len(THINK_CLOSE):]
    if mode == "official":
        second = rest.find(THINK_CLOSE)
        if second >= 0:
            rest = rest[:second]
    return rest


def cap_tail(text: str, max_chars: int = MAX_RESPONSE_CHARS) -> str:
    """Return the last ``max_chars`` characters of ``text`` (all of it when shorter)."""
    return text if len(text) <= max_chars else text[-max_chars:]


def _last_box_start(text: str) -> tuple[int, int]:
    """Index and command length of the last ``\\boxed`` or ``\\fbox`` in ``text`` (-1 if none)."""
    b, f = text.rfind("\\boxed"), text.rfind("\\fbox")
    if b < 0 and f < 0:
        return -1, 0
    return (b, len("\\boxed")) if b > f else (f, len("\\fbox"))


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, or None.

    Only the *last* box command counts (as in the official reward): when it is unclosed the
    result is None even if an earlier box was closed. The closing brace is found by counting
    ``{``/``}``. The space form ``\\boxed 5`` is accepted: its answer runs to the next ``$``
    or whitespace. Anything else after the command (e.g. ``\\boxedx``) gives None.
    """
    start, cmd_len = _last_box_start(text)
    if start < 0:
        return None
    i = start + cmd_len
    if i < len(text) and text[i] == " ":
        tail = text[i:].lstrip(" ")
        end = 0
        while end < len(tail) and tail[end] != "$" and not tail[end].isspace():
            end += 1
        return tail[:end] or None
    if i >= len(text) or text[i] != "{":
        return None
    j = closing_brace(text, i)
    return None if j is None else text[i + 1:j]


def unwrap_boxed(text: str) -> str:
    """``text`` with a ``\\boxed{...}`` wrapper removed when it contains one; else ``text``.

    Used on gold answers, some of which are stored as ``\\boxed{...}``.
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return text
    inner = last_boxed(text)
    return text if inner is None else inner
