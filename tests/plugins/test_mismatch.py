"""Rollout/trainer mismatch: correction weights of every mode and the per-bucket metrics, by hand.

The shared example (w = π_trainer / π_engine of each valid token; p = π_trainer):

    row 0: p = [0.9, 0.2, pad],   w = [3, 0.25, pad]
    row 1: p = [0.3, 0.4, 0.1],   w = [1.5, 1, 1.8]

Buckets of p: 0.9 → b3, 0.2 and 0.1 → b0, 0.3 and 0.4 → b1, nothing in b2. The padding holds
garbage (an engine NaN, a "log-prob" of 7) that must not reach any weight or metric.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from arlopti.plugins import mismatch
from arlopti.plugins.mismatch import METRIC_NAMES, mismatch_metrics
from arlopti.config.registries import ROLLOUT_CORRECTIONS
from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.config import ConfigError, RolloutCorrectionConfig, field_choices

L = math.log
B0, B1, B2, B3 = BUCKET_NAMES


@pytest.fixture()
def example():
    old = torch.tensor([[L(0.9), L(0.2), 7.0], [L(0.3), L(0.4), L(0.1)]])
    engine = torch.tensor([[L(0.3), L(0.8), math.nan], [L(0.2), L(0.4), L(0.1 / 1.8)]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return old, engine, mask


def correction_weights(old, engine, mask, mode, **values):
    """:func:`mismatch.correction_weights` with the schema's defaults for the values a case leaves out
    (the function itself has none: they exist once, in RolloutCorrectionConfig)."""
    rc = dataclasses.replace(RolloutCorrectionConfig(), **values)
    return mismatch.correction_weights(old, engine, mask, mode, rc.cap, rc.mis_low, rc.mis_high)


def close(actual, expected):
    assert torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6), (actual, expected)


def test_the_registry_holds_exactly_the_config_modes():
    choices = field_choices(RolloutCorrectionConfig.__dataclass_fields__["mode"])
    # "auto" resolves to one of them (arlopti.config.rules.effective_correction_mode), then registration order
    assert list(choices)[0] == "auto" and ROLLOUT_CORRECTIONS.names() == sorted(list(choices)[1:])
    assert list(choices) == ["auto", "none", "tis", "mis", "seq_tis"]  # each with its note
    assert choices["mis"] == "token masking (IcePop): tokens with w_t outside [mis_low, mis_high] leave the loss"


def test_none_is_one_on_valid_tokens(example):
    close(correction_weights(*example, mode="none"), [[1, 1, 0], [1, 1, 1]])


def test_tis_is_the_ratio_capped(example):
    close(correction_weights(*example, mode="tis", cap=2.0), [[2, 0.25, 0], [1.5, 1, 1.8]])
    close(correction_weights(*example, mode="tis", cap=1.6), [[1.6, 0.25, 0], [1.5, 1, 1.6]])


def test_mis_keeps_the_ratios_inside_the_closed_band(example):
    close(correction_weights(*example, mode="mis", mis_low=0.5, mis_high=2.0), [[0, 0, 0], [1, 1, 1]])
    close(correction_weights(*example, mode="mis", mis_low=0.2, mis_high=1.6), [[0, 1, 0], [1, 1, 0]])
    # the band is closed: w = 0.5 and w = 2 exactly are kept, just outside is not
    old = torch.tensor([[L(2.0), L(0.5), L(2.0) + 1e-4, L(0.5) - 1e-4]])
    w = correction_weights(old, torch.zeros_like(old), torch.ones_like(old), "mis", mis_low=0.5, mis_high=2.0)
    close(w, [[1, 1, 0, 0]])


def test_seq_tis_is_the_capped_product_on_every_token(example):
    # row 0: 3 · 0.25 = 0.75; row 1: 1.5 · 1 · 1.8 = 2.7
    close(correction_weights(*example, mode="seq_tis", cap=2.0), [[0.75, 0.75, 0], [2, 2, 2]])
    close(correction_weights(*example, mode="seq_tis", cap=5.0), [[0.75, 0.75, 0], [2.7, 2.7, 2.7]])


def test_seq_tis_sums_in_log_space():
    # exp(100) is inf in float32 and exp(-100 + log 1.5) a denormal: a product of token ratios
    # gives inf -> the cap; the sum of logs gives exactly 1.5
    old = torch.tensor([[100.0 - 100.0, L(1.5) - 100.0, 0.0]])
    engine = torch.tensor([[-100.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    naive = torch.exp(old - engine)[0, :2].prod()
    assert not torch.isfinite(naive)  # what the log space avoids
    close(correction_weights(old, engine, mask, "seq_tis", cap=2.0), [[1.5, 1.5, 0]])
    # 300 tokens of w = e^5: Σd = 1500 (product e^1500): exactly the cap, and 1/that: 0
    d = torch.full((2, 300), 5.0)
    d[1] = -5.0
    w = correction_weights(d, torch.zeros_like(d), torch.ones_like(d), "seq_tis", cap=3.0)
    assert torch.equal(w[0], torch.full((300,), 3.0)) and torch.equal(w[1], torch.zeros(300))


def test_large_log_differences_give_no_inf_or_nan():
    old = torch.tensor([[0.0, -1000.0, -0.5]])
    engine = torch.tensor([[-1000.0, 0.0, -0.5]])  # d = +1000, -1000, 0
    mask = torch.ones_like(old)
    close(correction_weights(old, engine, mask, "tis", cap=2.0), [[2, 0, 1]])
    close(correction_weights(old, engine, mask, "mis"), [[0, 0, 1]])
    close(correction_weights(old, engine, mask, "seq_tis", cap=2.0), [[1, 1, 1]])  # Σd = 0
    m = mismatch_metrics(old, engine, mask)
    assert all(math.isfinite(v) for k, v in m.items() if not k.endswith(B2) and not k.endswith(B1)), m
    assert m["mismatch/abs_diff_max"] == pytest.approx(1000.0)
    # k3 with d clamped at 20 above: (e^20 - 21) + (e^-1000 + 999) + 0, over 3 tokens
    assert m["mismatch/k3_kl"] == pytest.approx((math.exp(20) - 21 + 999) / 3)
    assert m["mismatch/ratio_outside_frac"] == pytest.approx(2 / 3)
    assert m[f"mismatch/tokens/{B0}"] == 1.0  # p = e^-1000 = 0 -> b0


def test_weights_are_detached_float32_and_zero_on_padding(example):
    old, engine, mask = example
    old = old.clone().requires_grad_(True)
    for mode in ROLLOUT_CORRECTIONS.names():
        w = correction_weights(old, engine, mask, mode)
        assert not w.requires_grad and w.dtype == torch.float32
        assert w[0, 2] == 0 and torch.isfinite(w).all(), mode


def test_bad_settings_are_config_errors(example):
    with pytest.raises(ConfigError, match="rollout_correction.mode='icepop'.*mis.*seq_tis"):
        correction_weights(*example, mode="icepop")
    with pytest.raises(ConfigError, match="cap=0"):
        correction_weights(*example, mode="tis", cap=0.0)
    with pytest.raises(ConfigError, match="mis_low < mis_high"):
        correction_weights(*example, mode="mis", mis_low=2.0, mis_high=0.5)
    old, engine, mask = example
    with pytest.raises(ValueError, match="same \\[B, T\\]"):
        correction_weights(old, engine[:, :2], mask, "tis")


def test_metrics_overall_and_per_bucket_by_hand(example):
    m = mismatch_metrics(*example)
    assert set(m) == {f"mismatch/{n}" for n in METRIC_NAMES} | {f"mismatch/{n}/{b}" for n in METRIC_NAMES
                                                                   for b in BUCKET_NAMES}
    w_all = [3, 0.25, 1.5, 1, 1.8]

    def k3(ws):
        return sum(w - L(w) - 1 for w in ws) / len(ws)

    expect = {
        "": dict(abs_diff_mean=sum(abs(L(w)) for w in w_all) / 5, abs_diff_max=L(4), k3_kl=k3(w_all),
                 ratio_outside_frac=2 / 5, tokens=5),
        B0: dict(abs_diff_mean=(L(4) + L(1.8)) / 2, abs_diff_max=L(4), k3_kl=k3([0.25, 1.8]),
                 ratio_outside_frac=1 / 2, tokens=2),
        B1: dict(abs_diff_mean=L(1.5) / 2, abs_diff_max=L(1.5), k3_kl=k3([1.5, 1]), ratio_outside_frac=0,
                 tokens=2),
        B3: dict(abs_diff_mean=L(3), abs_diff_max=L(3), k3_kl=k3([3]), ratio_outside_frac=1, tokens=1),
    }
    for b, values in expect.items():
        for name, v in values.items():
            key = f"mismatch/{name}" + (f"/{b}" if b else "")
            assert m[key] == pytest.approx(v, abs=1e-6), key


def test_an_empty_bucket_is_nan_with_zero_tokens(example):
    m = mismatch_metrics(*example)
    assert m[f"mismatch/tokens/{B2}"] == 0.0
    for name in METRIC_NAMES[:-1]:
        assert math.isnan(m[f"mismatch/{name}/{B2}"]), name
    no_tokens = mismatch_metrics(*(t[:, :0] for t in example))
    assert no_tokens["mismatch/tokens"] == 0.0 and math.isnan(no_tokens["mismatch/abs_diff_mean"])


def test_k3_estimates_kl_engine_to_trainer():
    """Tokens drawn in proportion to q = π_engine: the mean k3 is exactly KL(q ‖ p), not KL(p ‖ q)."""
    q, p = [0.5, 0.25, 0.25], [0.1, 0.45, 0.45]
    draws = [0, 0, 1, 2]  # frequencies 1/2, 1/4, 1/4 = q
    old = torch.tensor([[L(p[x]) for x in draws]], dtype=torch.float64)
    engine = torch.tensor([[L(q[x]) for x in draws]], dtype=torch.float64)
    k3 = mismatch_metrics(old, engine, torch.ones_like(old))["mismatch/k3_kl"]
    kl_qp = sum(qi * L(qi / pi) for qi, pi in zip(q, p))
    kl_pq = sum(pi * L(pi / qi) for qi, pi in zip(q, p))
    assert k3 == pytest.approx(kl_qp, abs=1e-12) and abs(kl_qp - kl_pq) > 0.1


def test_identical_log_probs_are_no_mismatch(example):
    old, _, mask = example
    m = mismatch_metrics(old, old, mask)
    for key in ("abs_diff_mean", "abs_diff_max", "k3_kl", "ratio_outside_frac"):
        assert m[f"mismatch/{key}"] == 0.0
    for mode in ("tis", "seq_tis", "mis"):
        close(correction_weights(old, old, mask, mode), [[1, 1, 0], [1, 1, 1]])


def test_auto_must_be_resolved_before_it_weighs_anything():
    """``mode=auto`` is a config value (tis under bounded staleness, else none): the weight function
    refuses it by name instead of failing on a registry lookup."""
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="effective_correction_mode; pass the resolved mode"):
        correction_weights(lp, lp, torch.ones(1, 2), "auto", cap=2.0, mis_low=0.5, mis_high=2.0)
