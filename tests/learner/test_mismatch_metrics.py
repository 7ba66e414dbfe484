"""``add_mismatch_metrics``: each ``mismatch/*`` value declared with the kind that combines it exactly.

Adding the same key twice to one MetricSet combines by its kind, the rule ``reduce_over_ranks``
applies across ranks; so two halves of a batch added one after the other must give the metrics of
the whole batch (token-weighted means, max of maxima, summed counts).
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.plugins.mismatch import mismatch_metrics
from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.learner.mismatch_metrics import add_mismatch_metrics
from arlopti.learner.metric_set import MetricSet

L = math.log
B0, B1, B2, B3 = BUCKET_NAMES


def batch():
    # rank 0: p = [0.9, 0.2] w = [3, 0.25];  rank 1: p = [0.3, 0.4, 0.1] w = [1.5, 1, 1.8]
    old = torch.tensor([[L(0.9), L(0.2), 0.0], [L(0.3), L(0.4), L(0.1)]])
    engine = torch.tensor([[L(0.3), L(0.8), 0.0], [L(0.2), L(0.4), L(0.1 / 1.8)]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return old, engine, mask


def test_kinds():
    ms = MetricSet()
    add_mismatch_metrics(ms, *batch())
    assert ms._kind["mismatch/tokens"] == "sum" and ms._kind[f"mismatch/tokens/{B0}"] == "sum"
    assert ms._kind["mismatch/abs_diff_max"] == "max" and ms._kind[f"mismatch/abs_diff_max/{B3}"] == "max"
    for name in ("abs_diff_mean", "k3_kl", "ratio_outside_frac"):
        assert ms._kind[f"mismatch/{name}"] == "mean" and ms._kind[f"mismatch/{name}/{B1}"] == "mean"


def test_two_halves_combine_to_the_whole_batch():
    old, engine, mask = batch()
    whole = mismatch_metrics(old, engine, mask)
    ms = MetricSet()
    add_mismatch_metrics(ms, old[:1], engine[:1], mask[:1])  # "rank 0": buckets b0, b3
    add_mismatch_metrics(ms, old[1:], engine[1:], mask[1:])  # "rank 1": buckets b0, b1
    got = ms.as_dict()
    for key, value in whole.items():
        if math.isnan(value):
            assert key not in got, key  # b2: no token anywhere, so no mean and no max
        else:
            assert got[key] == pytest.approx(value, abs=1e-9), key
    assert got["mismatch/ratio_outside_frac"] == pytest.approx(2 / 5)  # (1·2 + 0·3) / 5, token-weighted
    assert got[f"mismatch/k3_kl/{B0}"] == pytest.approx((0.25 - L(0.25) - 1 + 1.8 - L(1.8) - 1) / 2)
    assert got[f"mismatch/tokens/{B2}"] == 0.0 and f"mismatch/abs_diff_mean/{B2}" not in got


def test_a_bucket_empty_on_one_rank_does_not_pull_its_mean_to_zero():
    old, engine, mask = batch()
    ms = MetricSet()
    add_mismatch_metrics(ms, old[:1], engine[:1], mask[:1])  # b3 has its token here only
    add_mismatch_metrics(ms, old[1:], engine[1:], mask[1:])
    assert ms.as_dict()[f"mismatch/abs_diff_mean/{B3}"] == pytest.approx(L(3))
