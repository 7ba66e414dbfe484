"""Reasoning-word categories against reward (paper Fig. 5), over the completions of a rollout dump.

The paper counts six categories of inference-related words in responses and correlates their
frequency with reward (it reports analysis, statement and causal words correlating positively,
the other three negatively). Its word lists are not published; **the lists below are ours**
(also documented in docs/results.md). Matching rules:

* case-insensitive, on the completion only (never the prompt), with curly apostrophes normalised;
* each entry is a whole word or phrase: not preceded or followed by a letter, digit, ``_`` or
  apostrophe (so "so" does not match inside "also"), and a space in a phrase matches any run of
  whitespace;
* inflections are listed explicitly; every entry belongs to exactly one category ("so" is
  causal, never a conclusion indicator);
* words the K&K prompt itself uses in its rules text ("always", "never", "if", "then") are
  left out, since a small model copies them whatever its reasoning (the speech verbs of the
  statements, "says", "claims", …, do count as *statement* words, as in the paper).

Per response: ``count`` = matches of the category's entries, ``rate`` = count per 100 words
(words = maximal runs of letters, digits, apostrophes). Per category, over responses:
Pearson r between rate and reward (``r_rate``), and between raw count and reward (``r_count``),
with a 95% interval from Fisher's z (``ci95``; needs n > 3), and the share of responses where
the category occurs at all. A category that never varies gets r = None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

CATEGORIES: dict[str, tuple[str, ...]] = {
    "analysis": ("analyze", "analyzes", "analyzed", "analyzing", "analyse", "analyses", "analysed", "analysing",
                 "analysis", "consider", "considers", "considered", "considering", "examine", "examines",
                 "examined", "examining", "check", "checks", "checked", "checking", "evaluate", "evaluates",
                 "evaluating", "look at", "looking at", "let's", "let us", "step by step", "break down"),
    "statement": ("say", "says", "said", "saying", "state", "states", "stated", "statement", "statements",
                  "claim", "claims", "claimed", "tell", "tells", "told", "according to", "mention", "mentions",
                  "mentioned", "assert", "asserts", "asserted", "declare", "declares", "declared",
                  "remark", "remarks", "remarked", "report", "reports", "reported"),
    "causal": ("because", "since", "so", "due to", "as a result", "this means", "which means", "that means",
               "it means", "implies", "imply", "implied", "leads to", "lead to", "led to", "causes", "caused"),
    "conclusion": ("therefore", "thus", "hence", "consequently", "in conclusion", "conclude", "concludes",
                   "concluded", "conclusion", "finally", "in summary", "to summarize", "overall", "in the end",
                   "ultimately"),
    "assumption": ("assume", "assumes", "assumed", "assuming", "assumption", "suppose", "supposes", "supposed",
                   "supposing", "presume", "presuming", "hypothetically", "what if", "let's say", "hypothesis"),
    "assertion": ("must", "definitely", "certainly", "clearly", "obviously", "surely", "indeed", "undoubtedly",
                  "absolutely", "of course", "without doubt", "no doubt", "for sure", "necessarily"),
}
_WORD = re.compile(r"[A-Za-z0-9']+")


@dataclass(frozen=True)
class Matcher:
    """One alternation over every entry of every category, longest first, so that a span is counted
    once, for the longest entry covering it ("let's say" is an assumption, not also "let's" and "say")."""

    pattern: re.Pattern
    category_of: dict[str, str]  # entry (lower case, single spaces) -> category
    categories: tuple[str, ...]


def _entry_pattern(entry: str) -> str:
    body = r"\s+".join(re.escape(part) for part in entry.split())
    return rf"(?<![\w']){body}(?![\w'])"


def compile_categories(categories: dict[str, Sequence[str]] | None = None) -> Matcher:
    """The :class:`Matcher` of ``categories`` (default :data:`CATEGORIES`); an entry listed in two
    categories raises ``ValueError``."""
    cats = CATEGORIES if categories is None else categories
    category_of: dict[str, str] = {}
    for cat, entries in cats.items():
        for e in entries:
            key = " ".join(e.lower().split())
            if key in category_of:
                raise ValueError(f"word list entry {e!r} is in both {category_of[key]!r} and {cat!r}; "
                                 "each entry must belong to one category")
            category_of[key] = cat
    parts = [_entry_pattern(e) for e in sorted(category_of, key=len, reverse=True)]
    return Matcher(re.compile("|".join(parts), re.IGNORECASE), category_of, tuple(cats))


def normalise(text: str) -> str:
    return text.replace("\u2019", "'").replace("\u2018", "'")


def word_count(text: str) -> int:
    return len(_WORD.findall(normalise(text)))


def category_counts(text: str, matcher: Matcher | None = None) -> dict[str, int]:
    """Matches of each category in ``text`` (non-overlapping, longest entry first)."""
    m = matcher or compile_categories()
    out = dict.fromkeys(m.categories, 0)
    for hit in m.pattern.finditer(normalise(text)):
        out[m.category_of[" ".join(hit.group(0).lower().split())]] += 1
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson r, None when either side has zero variance or fewer than 2 points."""
    n = len(x)
    if n != len(y):
        raise ValueError(f"pearson: {n} x values but {len(y)} y values")
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(sxx * syy)


def fisher_ci(r: float | None, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """95% interval of a Pearson r from Fisher's z-transform; None if r is None or n ≤ 3."""
    if r is None or n <= 3:
        return None
    rc = max(min(r, 1 - 1e-12), -1 + 1e-12)
    centre, half = math.atanh(rc), z / math.sqrt(n - 3)
    return math.tanh(centre - half), math.tanh(centre + half)


@dataclass(frozen=True)
class CategoryResult:
    category: str
    r_rate: float | None
    r_count: float | None
    ci95: tuple[float, float] | None
    present_frac: float
    mean_rate: float


def correlate(texts: Sequence[str], rewards: Sequence[float],
              categories: dict[str, Sequence[str]] | None = None) -> dict:
    """Per-category correlations with reward (module docstring) plus the per-response table."""
    if len(texts) != len(rewards):
        raise ValueError(f"word-categories: {len(texts)} completions but {len(rewards)} rewards")
    pats = compile_categories(categories)
    rows = []
    for text, reward in zip(texts, rewards):
        counts = category_counts(text, pats)
        words = word_count(text)
        rows.append({"reward": float(reward), "words": words, "counts": counts,
                     "rates": {c: (100.0 * k / words if words else 0.0) for c, k in counts.items()}})
    rew = [r["reward"] for r in rows]
    results = []
    for cat in pats.categories:
        rates = [r["rates"][cat] for r in rows]
        counts = [float(r["counts"][cat]) for r in rows]
        r_rate = pearson(rates, rew)
        results.append(CategoryResult(cat, r_rate, pearson(counts, rew), fisher_ci(r_rate, len(rows)),
                                      sum(c > 0 for c in counts) / len(rows) if rows else 0.0,
                                      sum(rates) / len(rows) if rows else 0.0))
    return {"responses": len(rows), "reward_values": sorted(set(rew)),
            "categories": {c.category: {"r_rate": c.r_rate, "r_count": c.r_count,
                                        "ci95": list(c.ci95) if c.ci95 else None,
                                        "present_frac": c.present_frac, "mean_rate_per_100_words": c.mean_rate}
                           for c in results},
            "word_lists": {k: list(v) for k, v in (categories or CATEGORIES).items()}}


# The paper's reported signs (Fig. 5), for the comparison in the figure and docs/results.md.
PAPER_SIGNS = {"analysis": +1, "statement": +1, "causal": +1, "conclusion": -1, "assumption": -1, "assertion": -1}
