"""TokenDiagnosticsCallback wired into a real (tiny-model) training run; its TensorBoard histogram.

The pure statistics it logs are tested in tests/analysis/test_diagnostics.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from arlopti.learner.diagnostics import metrics_from_sums, prob_histogram, step_sums
from arlopti.callbacks.diagnostics import TokenDiagnosticsCallback, log_histogram
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
        # one tag per quantity: the phase token counts are the learner's alone
        assert not any(k.startswith("diag/lopti_tokens/") for k in m) and "lopti/low_tokens" in learner
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


def test_log_histogram_writes_the_sums():
    p = torch.tensor([[0.0, 0.04, 0.05, 0.51, 1.0, 0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    h = prob_histogram(p, mask, bins=20)
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


def test_nan_log_probs_are_left_out_with_a_warning_not_an_index_error(tiny_tokenizer, monkeypatch, caplog):
    """Issue 42: a NaN log-prob reached the histogram as bin index int64-min and the callback died with
    ``index -9223372036854775808 is out of bounds``. Here the learner's last step context gets NaN
    log-probs (before and after the update) and the callback runs on it again: the tags are those of
    the finite tokens, and a warning counts the others."""
    import arlopti.callbacks.diagnostics as diag_mod

    cfg = RunConfig(algorithm=AlgorithmConfig(), optim=OptimConfig(lr=1e-2),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                      logprob_micro_batch_size=8),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=8))
    cb = TokenDiagnosticsCallback(every_n_steps=1, update_direction_every_n_steps=1)
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    trainer = toy_trainer(callbacks=[cb], logger=CaptureLogger())
    trainer.fit(module, datamodule=dm)
    ctx = module.last_step_context
    mask = ctx.experience.response_mask.bool()
    rows, cols = mask.nonzero(as_tuple=True)
    ctx.old_log_probs[rows[0], cols[0]] = math.nan  # NaN before the update
    real = diag_mod.post_update_log_probs

    def post_update(*a, **k):  # and one more token NaN only after it
        out = real(*a, **k)
        out[rows[1], cols[1]] = math.nan
        return out

    monkeypatch.setattr(diag_mod, "post_update_log_probs", post_update)
    with caplog.at_level("WARNING", logger="arlopti.callbacks.diagnostics"):
        cb.on_train_batch_end(trainer, module, None, None, 0)
    m = cb.last_metrics
    assert sum(v for k, v in m.items() if k.startswith("diag/bucket_frac/")) == pytest.approx(1.0)
    kept = mask.clone()
    kept[rows[0], cols[0]] = False
    assert float(cb.last_hist[-1]) == int(kept.sum())  # the histogram counts the finite tokens only
    assert any(k.startswith("diag/update_dir_") for k in m) and not any(math.isnan(v) for v in m.values())
    found = [r.getMessage() for r in caplog.records if r.name == "arlopti.callbacks.diagnostics"]
    assert found == ["diagnostics at rollout step 1: 2 response tokens have a NaN log-prob (diverged weights) and "
                     "are left out of the diag/* tags"], found
