"""The pure token-probability statistics behind the diagnostics callback (tests/callbacks/test_diagnostics.py).

The SmolLM2 version of the bucket-fraction and gradient-mass checks, where the tokens spread over
all four buckets, is in test_mechanisms.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import Phase
from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.learner.diagnostics import DiagnosticSums, metrics_from_sums, prob_histogram, prob_range, step_sums


def test_step_sums_by_hand():
    p = torch.tensor([[0.1, 0.6, 0.9, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv_raw = torch.tensor([[2.0, 2.0, -1.0, 0.0]])
    alpha = 0.5
    w = alpha * p + 1 - alpha
    adv = adv_raw * w
    low = (p < 0.5) & mask.bool()
    sums = step_sums(p.log(), mask, adv, adv_raw, alpha, [Phase("low", low), Phase("high", mask.bool() & ~low)])
    m = metrics_from_sums(sums)
    assert m[f"diag/bucket_frac/{BUCKET_NAMES[0]}"] == pytest.approx(1 / 3)
    assert m[f"diag/bucket_frac/{BUCKET_NAMES[1]}"] == 0.0  # a fraction of 0 is a real value
    assert f"diag/ar_weight/{BUCKET_NAMES[1]}" not in m  # the mean of an empty bucket is not
    mass = [abs(float(adv[0, i])) * (1 - float(p[0, i])) for i in range(3)]
    assert m[f"diag/grad_mass_share/{BUCKET_NAMES[3]}"] == pytest.approx(mass[2] / sum(mass))
    assert m[f"diag/ar_weight/{BUCKET_NAMES[2]}"] == pytest.approx(float(w[0, 1]))
    assert m["diag/lopti_grad_mass_share/low"] == pytest.approx(mass[0] / sum(mass))
    flat, layout = sums.flat()
    again = metrics_from_sums(DiagnosticSums.unflat(flat, layout))
    assert again == pytest.approx(m)
    assert not any(math.isnan(v) for v in m.values())


def test_prob_histogram_by_hand():
    p = torch.tensor([[0.0, 0.04, 0.05, 0.51, 1.0, 0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    h = prob_histogram(p, mask, bins=20)
    counts, (s1, s2, n) = h[:20].tolist(), h[20:].tolist()
    want = [0.0] * 20
    want[0], want[1], want[10], want[19] = 2, 1, 1, 1  # 0 and .04 in [0, .05); .05 in [.05, .1); 1 in the last
    assert counts == want
    assert n == 5 and s1 == pytest.approx(1.6) and s2 == pytest.approx(0.04 ** 2 + 0.05 ** 2 + 0.51 ** 2 + 1)


def test_a_nan_log_prob_is_left_out_and_counted_not_cast_to_a_bin_index():
    """Issue 42: a NaN log-prob (diverged weights) became int64's minimum as a histogram bin index and the
    diagnostics died with ``index -9223372036854775808 is out of bounds``. Now the token is left out of every
    sum and counted in ``nonfinite``; the sums are exactly those of the finite tokens."""
    p = torch.tensor([[0.1, 0.6, 0.9, 0.5], [0.3, 0.8, 0.2, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[2.0, 2.0, -1.0, 0.0], [1.0, -1.0, 1.0, 1.0]])
    logp = p.log()
    logp[1, 1] = math.nan  # a valid token
    logp[0, 3] = math.nan  # padding: neither counted nor binned
    sums = step_sums(logp, mask, adv, adv, 0.3)
    keep = mask.clone()
    keep[1, 1] = 0.0
    want = step_sums(p.log(), keep, adv, adv, 0.3)
    assert float(sums.nonfinite) == 1.0 and float(want.nonfinite) == 0.0
    for name in ("counts", "mass", "mass_raw", "ar_weight", "hist"):
        assert torch.equal(getattr(sums, name), getattr(want, name)), name
    assert metrics_from_sums(sums) == pytest.approx(metrics_from_sums(want))
    flat, layout = sums.flat()  # the count travels with the other sums over ranks
    assert float(DiagnosticSums.unflat(flat, layout).nonfinite) == 1.0
    assert prob_range(logp, mask) == pytest.approx((0.1, 0.9))
    h = prob_histogram(logp.exp(), mask)
    assert float(h[-1]) == 6  # the count: the 6 finite valid tokens


def test_every_token_nan_gives_empty_sums_and_no_range():
    logp = torch.full((2, 3), math.nan)
    mask = torch.ones(2, 3)
    sums = step_sums(logp, mask, torch.ones(2, 3), torch.ones(2, 3))
    assert float(sums.nonfinite) == 6 and float(sums.counts.sum()) == 0 and float(sums.hist[-1]) == 0
    assert metrics_from_sums(sums) == {}
    assert prob_range(logp, mask) == (math.inf, -math.inf)
