"""Bounded staleness (arlopti.plugins.staleness) on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.plugins.staleness import (StalenessError, check_staleness_bound, low_prob_flip_counts,
                                       low_prob_flip_fraction, sample_staleness, staleness_metrics)


def test_staleness_is_the_trained_version_minus_each_rows_version():
    s = sample_staleness(7, torch.tensor([7, 6, 5, 7]))
    assert s.dtype == torch.long and s.tolist() == [0, 1, 2, 0]


def test_metrics_mean_max_and_the_histogram_over_0_to_k():
    m = staleness_metrics(torch.tensor([0, 1, 2, 0]), max_staleness=3)
    assert m == {"async/staleness_mean": 0.75, "async/staleness_max": 2.0,
                 "async/staleness_frac/0": 0.5, "async/staleness_frac/1": 0.25, "async/staleness_frac/2": 0.25,
                 "async/staleness_frac/3": 0.0}


def test_metrics_of_k_0_have_one_bin_and_no_sample_gives_no_metric():
    assert staleness_metrics(torch.tensor([0, 0]), 0) == {"async/staleness_mean": 0.0, "async/staleness_max": 0.0,
                                                          "async/staleness_frac/0": 1.0}
    assert staleness_metrics(torch.tensor([], dtype=torch.long), 2) == {}


def test_the_bound_passes_at_exactly_v_minus_k():
    check_staleness_bound(sample_staleness(10, torch.tensor([8, 9, 10])), max_staleness=2)


def test_a_sample_older_than_v_minus_k_raises_naming_count_largest_and_k():
    s = sample_staleness(10, torch.tensor([7, 8, 6, 10]))  # staleness 3, 2, 4, 0 with k = 2
    with pytest.raises(StalenessError, match=r"2 of 4 samples exceed rollout.async.max_staleness=2 "
                                             r"\(largest staleness 4\).*scheduler.*bug.*not trained"):
        check_staleness_bound(s, max_staleness=2)


def test_a_sample_from_the_future_raises():
    s = sample_staleness(3, torch.tensor([3, 4]))
    with pytest.raises(StalenessError, match=r"1 of 2 samples have negative staleness \(down to -1\).*bookkeeping"):
        check_staleness_bound(s, max_staleness=5)
    assert issubclass(StalenessError, RuntimeError)


def test_low_prob_flip_fraction_by_bucket_of_p_old():
    """threshold = 0.5. Valid tokens (p_old -> p_behaviour): 0.2 -> 0.6 flips (bucket 0), 0.2 -> 0.3 stays
    (bucket 0), 0.6 -> 0.4 flips (bucket 2), 0.9 -> 0.8 stays (bucket 3), 0.45 -> 0.55 flips
    (bucket 1); a padded position (p_old 0.9, p_beh 0.1) would flip but is not read."""
    old = torch.tensor([[0.2, 0.2, 0.6], [0.9, 0.45, 0.9]]).log()
    beh = torch.tensor([[0.6, 0.3, 0.4], [0.8, 0.55, 0.1]]).log()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    flips, tokens = low_prob_flip_counts(beh, old, mask, threshold=0.5)
    assert flips.tolist() == [1.0, 1.0, 1.0, 0.0] and tokens.tolist() == [2.0, 1.0, 1.0, 1.0]
    out = low_prob_flip_fraction(beh, old, mask, threshold=0.5)
    b0, b1, b2, b3 = BUCKET_NAMES
    assert out == {f"async/low_prob_flip_frac/{b0}": 0.5, f"async/low_prob_flip_frac/{b1}": 1.0,
                   f"async/low_prob_flip_frac/{b2}": 1.0, f"async/low_prob_flip_frac/{b3}": 0.0,
                   "async/low_prob_flip_frac/all": 0.6}


def test_an_empty_bucket_is_left_out_never_nan():
    old = torch.tensor([[0.9, 0.95]]).log()
    beh = torch.tensor([[0.3, 0.95]]).log()
    out = low_prob_flip_fraction(beh, old, torch.ones(1, 2), threshold=0.5)
    assert out == {f"async/low_prob_flip_frac/{BUCKET_NAMES[3]}": 0.5, "async/low_prob_flip_frac/all": 0.5}
    assert low_prob_flip_fraction(beh, old, torch.zeros(1, 2), threshold=0.5) == {}
    assert not any(math.isnan(v) for v in out.values())


def test_flip_counts_refuse_shapes_that_differ():
    with pytest.raises(ValueError, match="must be the same"):
        low_prob_flip_counts(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 3), 0.5)
