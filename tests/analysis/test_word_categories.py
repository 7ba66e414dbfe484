"""Word-category counting rules and the Pearson correlation, on hand-written texts."""

from __future__ import annotations

import math

import pytest

from arlopti.analysis.word_categories import (CATEGORIES, PAPER_SIGNS, category_counts, compile_categories,
                                              correlate, fisher_ci, pearson, word_count)


def test_whole_words_longest_entry_once_case_insensitive():
    text = ("Let's say Zoey is a knight. LET'S check it: she also said so. So we conclude, "
            "clearly. Let   us consider it. Zoey’s claim. Assumedly not.")
    c = category_counts(text)
    # "Let's say" is one assumption (not also "let's" + "say"); "also" holds no "so"
    assert c["assumption"] == 1
    assert c["analysis"] == 4  # LET'S, check, "Let   us", consider
    assert c["statement"] == 2  # said, claim
    assert c["causal"] == 2  # "so" twice (the second one starts "So we conclude")
    assert c["conclusion"] == 1 and c["assertion"] == 1
    assert word_count("Zoey’s claim, ok.") == 3


def test_every_entry_in_exactly_one_category_and_signs_cover_them():
    compile_categories()  # raises on a duplicate
    assert set(CATEGORIES) == set(PAPER_SIGNS)
    with pytest.raises(ValueError, match="in both"):
        compile_categories({"a": ("so",), "b": ("So",)})


def test_pearson_and_fisher_interval():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) is None
    lo, hi = fisher_ci(0.5, 30)
    assert lo < 0.5 < hi and -1 < lo and hi < 1
    assert fisher_ci(0.5, 3) is None


def test_correlate_signs_follow_the_data():
    texts = ["because because so therefore", "because so", "therefore thus hence", "hence thus"]
    rewards = [3.0, 3.0, -3.0, -3.0]
    res = correlate(texts, rewards)
    cats = res["categories"]
    assert cats["causal"]["r_rate"] > 0.9 and cats["conclusion"]["r_rate"] < -0.9
    assert cats["assumption"]["r_rate"] is None and cats["assumption"]["present_frac"] == 0
    assert res["responses"] == 4 and not math.isnan(cats["causal"]["mean_rate_per_100_words"])
    with pytest.raises(ValueError, match="2 completions but 1 rewards"):
        correlate(["a", "b"], [1.0])
