"""The study's statistics added for issue 51, by hand: Bonferroni, the family-wise CI, the split of a paired
difference's variance into sampling noise and the between-seed term, and the pilot's sample sizes."""

from __future__ import annotations

import math

import pytest

from arlopti.study.stats import (adjusted_ci, between_seed_variance, bonferroni, items_needed, mean_ci,
                                 seeds_needed, window_noise_variance)


def test_bonferroni_multiplies_and_caps():
    assert bonferroni(0.01, 6) == pytest.approx(0.06) and bonferroni(0.3, 6) == 1.0
    with pytest.raises(ValueError):
        bonferroni(0.1, 0)


def test_the_family_wise_ci_is_wider_than_the_95_ci_and_one_comparison_is_it():
    v = [0.1, -0.2, 0.3, 0.05, 0.2, -0.1, 0.4, 0.0]
    lo, hi = mean_ci(v)["ci95"]
    assert adjusted_ci(v, 1) == pytest.approx([lo, hi])
    flo, fhi = adjusted_ci(v, 6)
    assert flo < lo and fhi > hi and adjusted_ci([None], 6) == [None, None]


def test_window_noise_variance_by_hand():
    # last 4 of [9, 1, 2, 3, 4]: mean 2.5, sample variance (2.25+0.25+0.25+2.25)/3 = 5/3, over 4 steps
    assert window_noise_variance([9, 1, 2, 3, 4], 4) == pytest.approx(5 / 12)
    with pytest.raises(ValueError):
        window_noise_variance([1.0], 1)


def test_between_seed_variance_by_hand():
    # differences 1, 3, 5: sample variance 4; mean noise 1 -> between 3, share 0.75
    r = between_seed_variance([1.0, 3.0, 5.0], [0.5, 1.0, 1.5])
    assert (r["total"], r["noise"], r["between"], r["between_share"], r["seeds"]) == (4.0, 1.0, 3.0, 0.75, 3)
    assert between_seed_variance([1.0, 1.2], [1.0, 1.0])["between"] == 0.0  # noise explains it all
    with pytest.raises(ValueError):
        between_seed_variance([1.0, 2.0], [1.0])


def test_items_needed_at_80_percent_power_by_hand():
    k = (1.959964 + 0.841621) ** 2  # 7.849
    # two uncorrelated accuracies of 0.1: item variance 2 * 0.09; delta 0.02, one seed, no seed term
    assert items_needed(0.02, 0.18, 1) == pytest.approx(k * 0.18 / 0.02 ** 2, rel=1e-5)  # about 3,532
    assert items_needed(0.02, 0.5, 1) == pytest.approx(k * 0.5 / 0.02 ** 2, rel=1e-5)  # p = 0.5: about 9,812
    # the old 50%-power figure: 2 * 1.96^2 * 0.09 / 0.02^2, about 1,729
    assert items_needed(0.02, 0.18, 1, power=0.5) == pytest.approx(1.959964 ** 2 * 0.18 / 0.0004, rel=1e-5)
    # a seed term: S = 6 seeds, seed variance 1e-4 -> room = 0.0004/k - 1e-4/6
    room = 0.0004 / k - 1e-4 / 6
    assert items_needed(0.02, 0.18, 6, seed_variance=1e-4) == pytest.approx(0.18 / (6 * room), rel=1e-5)
    assert math.isinf(items_needed(0.02, 0.18, 1, seed_variance=1e-4))  # one seed cannot resolve it


def test_seeds_needed_by_hand():
    k = (1.959964 + 0.841621) ** 2
    assert seeds_needed(0.02, 1e-4) == pytest.approx(k * 1e-4 / 0.0004, rel=1e-5)  # about 1.96 seeds
    s = seeds_needed(0.02, 1e-4)
    assert math.isinf(items_needed(0.02, 0.18, math.floor(s), seed_variance=1e-4))
    assert math.isfinite(items_needed(0.02, 0.18, math.ceil(s), seed_variance=1e-4))
