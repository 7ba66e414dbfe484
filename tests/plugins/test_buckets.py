"""Bucket edges and per-bucket statistics, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.plugins.buckets import (BUCKET_NAMES, bucket_counts, bucket_fractions, bucket_index, bucket_means,
                                     grad_mass_shares, is_monotone_decreasing, per_bucket_dict,
                                     stratified_token_sample, update_direction_counts,
                                     update_direction_fractions)


def test_bucket_edges_follow_the_paper_intervals():
    p = torch.tensor([0.0, 0.1, 0.25, 0.2500001, 0.5, 0.50001, 0.75, 0.7501, 1.0])
    assert bucket_index(p).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3]


def test_names_and_labels_are_made_from_the_edges():
    """The edges are written once; the tag names and the figure and table labels follow from them."""
    from arlopti.plugins.buckets import BUCKET_EDGES, BUCKET_LABELS

    assert BUCKET_EDGES == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert BUCKET_NAMES == ("0.00-0.25", "0.25-0.50", "0.50-0.75", "0.75-1.00")
    assert BUCKET_LABELS == ("[0, .25]", "(.25, .5]", "(.5, .75]", "(.75, 1]")


def test_bucket_index_rejects_log_probs():
    with pytest.raises(ValueError, match="exp\\(log_probs\\)"):
        bucket_index(torch.tensor([-0.5, -2.0]))


def test_fractions_counts_and_means_ignore_padding():
    p = torch.tensor([[0.1, 0.3, 0.9, 0.99], [0.6, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    assert bucket_counts(p, mask).tolist() == [2, 1, 1, 2]
    frac = bucket_fractions(p, mask)
    assert frac.sum().item() == pytest.approx(1.0)
    assert frac.tolist() == pytest.approx([2 / 6, 1 / 6, 1 / 6, 2 / 6])
    values = torch.arange(8, dtype=torch.float32).view(2, 4)
    # b0: tokens (0,0)=0 and (1,1)=5; b3: (0,2)=2, (0,3)=3
    assert bucket_means(values, p, mask).tolist() == pytest.approx([2.5, 1.0, 4.0, 2.5])


def test_empty_bucket_mean_is_nan_not_zero():
    p = torch.tensor([[0.1, 0.2]])
    m = bucket_means(torch.ones(1, 2), p, torch.ones(1, 2))
    assert m[0] == 1.0 and all(math.isnan(v) for v in m[1:].tolist())
    assert per_bucket_dict(m) == {BUCKET_NAMES[0]: 1.0, BUCKET_NAMES[1]: None, BUCKET_NAMES[2]: None,
                                  BUCKET_NAMES[3]: None}


def test_grad_mass_shares_match_a_loop():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(4, 7, generator=gen)
    adv = torch.randn(4, 7, generator=gen)
    mask = (torch.rand(4, 7, generator=gen) > 0.2).float()
    shares = grad_mass_shares(p, adv, mask)
    want = [0.0] * 4
    for i in range(4):
        for j in range(7):
            if mask[i, j]:
                b = 0 if p[i, j] <= 0.25 else 1 if p[i, j] <= 0.5 else 2 if p[i, j] <= 0.75 else 3
                want[b] += abs(float(adv[i, j])) * (1 - float(p[i, j]))
    total = sum(want)
    assert shares.tolist() == pytest.approx([w / total for w in want], rel=1e-6)


def test_update_direction_counts_by_sign_and_bucket():
    old = torch.log(torch.tensor([[0.1, 0.1, 0.9, 0.9, 0.6]]))
    new = old + torch.tensor([[0.5, -0.5, 0.1, 0.0, -0.2]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 0.0]])
    counts = update_direction_counts(old, new, adv, torch.ones(1, 5))
    assert counts["pos_total"].tolist() == [2, 0, 0, 1]
    assert counts["pos_up"].tolist() == [1, 0, 0, 1]
    assert counts["neg_total"].tolist() == [0, 0, 0, 1]
    assert counts["neg_down"].tolist() == [0, 0, 0, 0]  # unchanged is not "fell"
    pos, neg = update_direction_fractions(counts)
    assert pos[0] == 0.5 and pos[3] == 1.0 and math.isnan(pos[1])
    assert neg[3] == 0.0 and math.isnan(neg[0])


def test_stratified_sample_spreads_over_buckets_and_fills_from_others():
    p = torch.tensor([[0.1] * 10 + [0.9] * 10 + [0.4] * 2])
    mask = torch.ones_like(p)
    picks = stratified_token_sample(p, mask, 12, torch.Generator().manual_seed(0))
    assert len(picks) == len(set(picks)) == 12
    b = bucket_index(p[0, [c for _, c in picks]]).tolist()
    # 3 per bucket wanted; b1 has only 2 and b2 none, so the 4 spare draws go to b0 then b3
    assert b.count(1) == 2 and b.count(2) == 0 and b.count(0) + b.count(3) == 10
    assert b.count(0) >= 3 and b.count(3) >= 3
    masked = stratified_token_sample(p, torch.zeros_like(p), 5)
    assert masked == []


def test_monotone():
    assert is_monotone_decreasing([4.0, 3.0, None, 1.0])
    assert not is_monotone_decreasing([4.0, 3.0, 3.0, 1.0])
    assert is_monotone_decreasing([None, 2.0]) is None


def test_token_distribution_by_hand():
    from arlopti.plugins.buckets import token_distribution

    p = torch.tensor([[0.1, 0.2, 0.6, 0.99, 0.95, 0.3]])
    adv = torch.tensor([[1.0, -1.0, 2.0, -2.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    d = token_distribution(p, adv, mask, bins=10)
    assert d["tokens"] == 5 and sum(d["histogram"]) == 5 and d["histogram"][9] == 2 and d["histogram"][1] == 1
    assert list(d["fraction"].values()) == pytest.approx([0.4, 0.0, 0.2, 0.4])
    assert d["adv_mean"]["0.00-0.25"] == 0.0 and d["adv_mean"]["0.25-0.50"] is None
    assert d["adv_pos_frac"]["0.75-1.00"] == 0.5 and d["adv_quantiles"]["0.50-0.75"] == [2.0] * 5


def test_rounding_above_one_lands_in_the_top_bucket():
    # a fused / bf16 log-prob kernel can return log p slightly above 0 for a saturated token
    from arlopti.plugins.buckets import grad_mass, prob_bin_counts

    p = torch.exp(torch.tensor([[1e-5, -3.0]]))
    assert float(p[0, 0]) > 1 + 1e-6
    assert bucket_index(p).tolist() == [[3, 0]]
    assert float(grad_mass(p, torch.ones_like(p))[0, 0]) == 0.0
    assert prob_bin_counts(p, torch.ones_like(p), bins=4).tolist() == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="must lie in"):
        bucket_index(torch.tensor([1.01]))


def test_prob_bin_counts_refuses_a_nan_instead_of_an_int64_min_index():
    """Issue 42: NaN * bins floored and cast to long is -9223372036854775808, which scatter_add_ refused as
    ``index ... is out of bounds``. A valid token with a non-finite p is now a ValueError that says so; a NaN
    off the mask is ignored like any padding."""
    from arlopti.plugins.buckets import prob_bin_counts

    p = torch.tensor([[0.1, math.nan, 0.9], [0.3, 0.5, math.nan]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match=r"prob_bin_counts: 1 of the 5 valid tokens have a non-finite probability"):
        prob_bin_counts(p, mask, bins=4)
    mask[0, 1] = 0.0
    assert prob_bin_counts(p, mask, bins=4).tolist() == [1.0, 1.0, 1.0, 1.0]
