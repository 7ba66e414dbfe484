"""The K&K reward: the Logic-RL / AR-Lopti rule (``verl/utils/reward_score/kk.py``), re-implemented.

``response`` is the text generated after a prompt that ends in ``<think>``; the rule is applied to
``"<think>" + response``, so that pre-filled tag counts as the one allowed ``<think>`` (with
``official_cut=True``, to the official tail, see below).

Format (+1 / -1)
    The text must contain exactly one each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>``,
    and their first occurrences must come in that order.
Answer (+2 / -1.5 / -2), only when the format is valid
    The answer is the content of the last non-greedy ``<answer>...</answer>`` pair, stripped. It
    *parses* when the case-insensitive counts of the substrings "knight" and "knave" sum to exactly
    N (so plurals and extra mentions break it) and every gold name matches
    ``\\bNAME\\b\\s+is\\s+a\\s+\\b(knight|knave)\\b`` case-insensitively (first match used; the name is
    ``re.escape``-d). Exact match of every role: +2; parsed but some role differs: -1.5; not
    parsed, empty, or format invalid: -2.
Totals
    3 (correct), -0.5 (well-formed, wrong), -1 (well-formed, unparseable), -3 (bad format).

Gold: each non-empty line of ``solution_text_format`` gives a name (the first ``[A-Za-z]+`` word,
i.e. the word after "(k)") and a role (the first whole word "knight"/"knave" after it).

The official cut (``official_cut=True``; ``fidelity=official`` sets ``tasks.kk.official_cut``)
    The original (AR-Lopti ``verl/utils/reward_score/kk.py``: ``compute_score`` calls
    ``extract_solution``) scores the decoded prompt+response (``RewardManager`` in
    ``verl/trainer/main_ppo.py`` decodes the two together, special tokens kept), and first
    isolates the response: it keeps what follows the first "Assistant:" if the text has one, else
    what follows the first "<|im_start|>assistant", else the whole text. By default we score
    ``"<think>" + response`` whatever the response holds. With ``official_cut=True`` a response
    that contains "Assistant:" is scored on what follows its first "Assistant:" instead (so the
    pre-filled ``<think>`` is lost, and the format check fails unless that tail brings exactly one
    ``<think>`` of its own); a response without it is scored as by default.

    Why that is the official tail, computed from the response alone: the official prompt (the
    ``official`` template) and the ``qwen-instruct`` prompt under a ChatML chat template contain no
    "Assistant:", hold "<|im_start|>assistant" exactly once, and end in
    "<|im_start|>assistant\\n<think>" (tested for all 5,000 official fixture prompts). An
    "Assistant:" cannot straddle the prompt/response boundary, since the prompt ends in ">", which
    "Assistant:" does not contain. So the first "Assistant:" of prompt+response, if any, lies in
    the response, and the official tail is the response after it; otherwise the official tail is
    "\\n<think>" + response (after the prompt's one "<|im_start|>assistant"), which scores exactly
    as "<think>" + response: a leading newline changes no tag count, tag order or answer span.
    (The decoded prompt is the prompt string: the byte-level BPE round trip is exact, and the
    prompt ends on a whole token.) With the ``base`` template the prompt itself ends in
    "Assistant: <think>", so the official cut falls inside the prompt and the official tail is
    " <think>" + response whatever the response holds: there the default (``official_cut=False``)
    is the exact official rule.

Differences from the original, on purpose:

* by default (``official_cut=False``) a response that itself contains "Assistant:" is not cut
  there (see above);
* the last-answer extraction uses ``str.find`` instead of a lazy DOTALL regex. Both give the same
  span, but the regex is quadratic on text with many unclosed ``<answer>`` tags, and this is
  linear. The name patterns are anchored on a literal name, so they stay linear. There is no length
  cap: a 1 MB response is scored in milliseconds (see the tests).
* nothing is printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
FORMAT_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

FORMAT_REWARD = 1.0
ANSWER_CORRECT, ANSWER_WRONG, ANSWER_UNPARSEABLE = 2.0, -1.5, -2.0
CORRECT_TOTAL = FORMAT_REWARD + ANSWER_CORRECT  # 3.0

_GOLD_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)


@dataclass(frozen=True)
class KKScore:
    """The detailed score of one response.

    ``parsed`` is the name -> "knight"/"knave" map read from the answer, or None when the format
    check failed (the rule does not parse then) or the answer did not parse.
    """

    total: float
    format_ok: bool
    parsed: dict[str, str] | None
    correct: bool
    answer_score: float


def format_ok(text: str) -> bool:
    """The structure check on the full text (pre-filled ``<think>`` included), see module doc."""
    positions = []
    for tag in FORMAT_TAGS:
        if text.count(tag) != 1:
            return False
        positions.append(text.find(tag))
    return positions == sorted(positions)


def extract_last_answer(text: str) -> str | None:
    """Stripped content of the last ``<answer>...</answer>`` pair, pairing left to right.

    Same span as the last match of ``re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL)``:
    each ``<answer>`` pairs with the first ``</answer>`` after it and scanning resumes after that.
    """
    pos, last = 0, None
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            break
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break  # no closer after this opener, hence none after any later opener either
        last = (start + len(ANSWER_OPEN), end)
        pos = end + len(ANSWER_CLOSE)
    return None if last is None else text[last[0]:last[1]].strip()


@lru_cache(maxsize=65536)
def parse_gold(solution_text_format: str) -> dict[str, str]:
    """Name -> role ("knight"/"knave", lower case) from the gold text, in line order.

    Lines without a name and role are skipped, as in the original. Raises ``ValueError`` when no
    line parses (a data bug: gold texts are validated when records are loaded).
    """
    if not isinstance(solution_text_format, str):
        raise ValueError(f"solution_text_format must be a string, got {type(solution_text_format).__name__}")
    out: dict[str, str] = {}
    for line in solution_text_format.split("\n"):
        line = line.strip()
        if not line:
            continue
        match = _GOLD_LINE.search(line)
        if match:
            out[match.group(1)] = match.group(2).lower()
    if not out:
        raise ValueError(f"solution_text_format {solution_text_format[:200]!r} has no "
                         "'(k) NAME is a knight/knave' line")
    return out


@lru_cache(maxsize=4096)
def _name_pattern(name: str) -> re.Pattern:
    return re.compile(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", re.IGNORECASE)


def parse_answer(answer: str, names: list[str] | tuple[str, ...]) -> dict[str, str] | None:
    """Name -> role read from an answer, or None when it does not parse (see module doc)."""
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    out: dict[str, str] = {}
    for name in names:
        match = _name_pattern(name).search(answer)
        if match is None:
            return None
        out[name] = match.group(1).lower()
    return out


OFFICIAL_CUT = "Assistant:"


def scored_text(response: str, official_cut: bool = False) -> str:
    """The text the rule is applied to: ``"<think>" + response``, or with ``official_cut`` and a
    response containing "Assistant:", what follows its first "Assistant:" (module docstring)."""
    if official_cut:
        _, cut, tail = response.partition(OFFICIAL_CUT)
        if cut:
            return tail
    return THINK_OPEN + response


def score_response_detailed(response: str, solution_text_format: str, official_cut: bool = False) -> KKScore:
    """Score ``response`` (text after a prompt ending in ``<think>``) against the gold text.

    ``official_cut``: cut the response after its first "Assistant:" as the official reward does
    (see the module docstring); default False. Never raises for any ``response`` string; raises
    ``ValueError`` for a gold text with no parsable line (see :func:`parse_gold`).
    """
    gold = parse_gold(solution_text_format)
    if not isinstance(response, str):
        response = "" if response is None else str(response)
    text = scored_text(response, official_cut)
    if not format_ok(text):
        return KKScore(total=-FORMAT_REWARD + ANSWER_UNPARSEABLE, format_ok=False, parsed=None,
                       correct=False, answer_score=ANSWER_UNPARSEABLE)
    answer = extract_last_answer(text)
    parsed = parse_answer(answer, list(gold)) if answer else None
    # ``not parsed`` (not ``is None``): an empty map counts as unparsed, as in the original.
    if not parsed:
        answer_score = ANSWER_UNPARSEABLE
    elif parsed == gold:
        answer_score = ANSWER_CORRECT
    else:
        answer_score = ANSWER_WRONG
    total = FORMAT_REWARD + answer_score
    return KKScore(total=total, format_ok=True, parsed=parsed or None, correct=total == CORRECT_TOTAL,
                   answer_score=answer_score)


def score_response(response: str, solution_text_format: str, official_cut: bool = False) -> float:
    """The total reward, one of 3, -0.5, -1, -3 (see :func:`score_response_detailed`)."""
    return score_response_detailed(response, solution_text_format, official_cut).total
