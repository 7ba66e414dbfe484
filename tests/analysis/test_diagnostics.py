"""TokenDiagnosticsCallback wired into a real (tiny-model) training run, and its pure statistics.

The SmolLM2 version of the bucket-fraction and gradient-mass checks, where the tokens spread over
all four buckets, is in test_mechanisms.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from arlopti.algorithms import Phase
from arlopti.analysis.buckets import BUCKET_NAMES
from arlopti.analysis.diagnostics import (DiagnosticSums, TokenDiagnosticsCallback, log_histogram, metrics_from_sums,
                                          prob_histogram, step_sums)
from arlopti.config import AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


class HistogramWriter:
    """Stands in for TensorBoard's SummaryWriter: records add_histogram_raw calls."""

    def __init__(self):
        self.hists: list[dict] = []

    def add_histogram_raw(self, tag, **kwargs):
        self.hists.append({"tag": tag, **kwargs})


class CaptureLogger(Logger):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[int, dict]] = []
        self._writer = HistogramWriter()

    @property
    def experiment(self):
        return self._writer

    @property
    def name(self):
        return "capture"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))


def test_callback_logs_the_tags_on_its_schedule(tiny_tokenizer):
    # a random model puts p ~ 1/vocab on every token: eta 0.002 splits them into two Lopti phases
    cfg = RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.002)),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=8))
    cb = TokenDiagnosticsCallback(every_n_steps=1, update_direction_every_n_steps=2)
    logger = CaptureLogger()
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=2)
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=[cb], logger=logger).fit(module, datamodule=dm)
    diag = {step: m for step, m in logger.calls if any(k.startswith("diag/") for k in m)}
    assert sorted(diag) == [1, 2]
    for step, m in diag.items():
        fr = [v for k, v in m.items() if k.startswith("diag/bucket_frac/")]
        assert sum(fr) == pytest.approx(1.0)
        shares = [v for k, v in m.items() if k.startswith("diag/grad_mass_share/")]
        assert sum(shares) == pytest.approx(1.0)
        assert any(k.startswith("diag/ar_weight/") for k in m)
        phases = m["diag/lopti_grad_mass_share/low"] + m["diag/lopti_grad_mass_share/high"]
        assert phases == pytest.approx(1.0)
        learner = {k: v for st, mm in logger.calls if st == step for k, v in mm.items()}
        for ph in ("low", "high"):  # the learner's own phase counts of the same step
            assert m[f"diag/lopti_tokens/{ph}"] == learner[f"lopti/{ph}_tokens"]
        assert m["timing/diagnostics_s"] >= 0
    assert not any("update_dir" in k for k in diag[1])
    assert any(k.startswith("diag/update_dir_pos/") for k in diag[2])
    # the last step's metrics are exactly the pure function of the learner's context
    ctx = module.last_step_context
    want = metrics_from_sums(step_sums(ctx.old_log_probs, ctx.experience.response_mask, ctx.advantages,
                                       ctx.advantages_raw, 0.3, ctx.phases))
    for k, v in want.items():
        assert diag[2][k] == pytest.approx(v, rel=1e-9)
    # one histogram per step, over exactly the step's valid tokens
    hists = logger.experiment.hists
    assert [h["global_step"] for h in hists] == [1, 2] and {h["tag"] for h in hists} == {"diag/token_prob_hist"}
    p = ctx.old_log_probs.exp()[ctx.experience.response_mask.bool()].double()
    assert hists[1]["num"] == p.numel() == sum(hists[1]["bucket_counts"])
    assert hists[1]["min"] == pytest.approx(float(p.min())) and hists[1]["max"] == pytest.approx(float(p.max()))
    assert hists[1]["sum"] == pytest.approx(float(p.sum()))


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
    assert m["diag/lopti_tokens/low"] == 1.0 and m["diag/lopti_tokens/high"] == 2.0
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
    w = HistogramWriter()
    assert log_histogram(w, "t", h, (0.0, 1.0), step=3)
    (call,) = w.hists
    assert call["bucket_limits"][0] == pytest.approx(0.05) and call["bucket_limits"][-1] == 1.0
    assert call["num"] == 5 and call["global_step"] == 3
    assert not log_histogram(w, "t", prob_histogram(p, torch.zeros_like(mask)), (math.inf, -math.inf), step=4)


def test_bad_schedule_is_named():
    with pytest.raises(ValueError, match="update_direction_every_n_steps=0"):
        TokenDiagnosticsCallback(update_direction_every_n_steps=0)
    with pytest.raises(ValueError, match="hist_bins=0"):
        TokenDiagnosticsCallback(hist_bins=0)
