"""Samples from older weights in the learner (arlopti.learner.async_metrics; issue 27): the staleness
guard stops a step before any optimizer step, the ``async/*`` tags are written with their reduction
kinds, and each of them is a row of docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.plugins.staleness import StalenessError
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.async_metrics import add_async_metrics
from arlopti.learner.experience import Experience
from arlopti.learner.module import GRPOModule
from arlopti.learner.metric_set import MetricSet
from helpers.toy import ToyDataModule, toy_trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _exp(versions, engine=None) -> Experience:
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return Experience(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.long),
                      response_mask=mask, prompt_len=1, rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long),
                      truncated=torch.zeros(2, dtype=torch.bool), correct=torch.zeros(2, dtype=torch.bool),
                      engine_logprobs=engine, policy_versions=versions)


def test_rows_without_versions_add_nothing():
    metrics = MetricSet()
    add_async_metrics(metrics, _exp(None), torch.zeros(2, 2), trained_version=5, max_staleness=0, threshold=0.5)
    assert metrics.as_dict() == {}


def test_the_values_and_their_rank_reduction_kinds():
    """Versions 4 and 3 trained at 5 (staleness 1, 2; k = 2). Valid tokens p_old -> p_behaviour:
    0.8 -> 0.3 (flips at eta 0.5), 0.2 -> 0.1, 0.6 -> 0.6."""
    old = torch.tensor([[0.8, 0.2], [0.6, 0.9]]).log()
    engine = torch.tensor([[0.3, 0.1], [0.6, 0.01]]).log()
    metrics = MetricSet()
    add_async_metrics(metrics, _exp(torch.tensor([4, 3]), engine), old, trained_version=5, max_staleness=2, threshold=0.5)
    b0, _, b2, b3 = BUCKET_NAMES
    assert metrics.as_dict() == pytest.approx({
        "async/staleness_mean": 1.5, "async/staleness_max": 2.0, "async/staleness_frac/0": 0.0,
        "async/staleness_frac/1": 0.5, "async/staleness_frac/2": 0.5, f"async/low_prob_flip_frac/{b0}": 0.0,
        f"async/low_prob_flip_frac/{b2}": 0.0, f"async/low_prob_flip_frac/{b3}": 1.0, "async/low_prob_flip_frac/all": 1 / 3})
    kinds = metrics._kind
    assert kinds["async/staleness_max"] == "max"
    assert {kinds[k] for k in kinds if k != "async/staleness_max"} == {"mean"}
    assert metrics._den["async/staleness_mean"] == 2.0 and metrics._den["async/low_prob_flip_frac/all"] == 3.0


def test_every_async_tag_is_a_row_of_the_metrics_docs_and_every_row_is_written():
    rows = [m.group(1) for m in re.finditer(r"^\| `(async/[^`]+)` \|", DOC.read_text(), re.M)]
    patterns = [re.compile(re.sub(r"<[a-z]+>", "[^/]+", re.escape(r).replace(r"\<", "<").replace(r"\>", ">")) + "$")
                for r in rows]
    old = torch.tensor([[0.1, 0.3], [0.6, 0.9]]).log()  # valid tokens in buckets 0, 1 and 2
    metrics = MetricSet()
    exp = _exp(torch.tensor([4, 5]), old)
    exp.async_stats = {"trainer_wait_s": 0.5, "worker_idle_s": 0.1, "queue_depth": 2.0, "sync_s": 0.2,
                       "generate_s": 1.0, "policy_version": 4.0, "restarts": 0.0, "worker0/tokens_per_s": 300.0}
    add_async_metrics(metrics, exp, old, trained_version=5, max_staleness=1, threshold=0.5)
    assert metrics.as_dict()["async/worker0/tokens_per_s"] == 300.0 and metrics._kind["async/queue_depth"] == "max"
    tags = list(metrics.as_dict())
    assert [t for t in tags if not any(p.match(t) for p in patterns)] == []
    assert [r for r, p in zip(rows, patterns) if not any(p.match(t) for t in tags)] == []


class StampVersions(L.Callback):
    """Stamps the rollout's rows with policy versions, as a rollout worker would (after the rollout
    callback has attached the experience)."""

    def __init__(self, versions: list[int]):
        self.versions = versions

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        n = len(batch.experience)
        batch.experience.policy_versions = torch.tensor((self.versions * n)[:n], dtype=torch.long)


def _module(tok, k: int, trained_version: int) -> GRPOModule:
    cfg = RunConfig(algorithm=AlgorithmConfig(), optim=OptimConfig(lr=1e-2),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=8))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=trained_version + 1)
    module.cfg.rollout.async_.max_staleness = k  # the learner reads k from its config, whatever the placement
    module.rollout_step = trained_version
    return module


def _fit(module: GRPOModule, tok, versions: list[int]) -> None:
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=(StampVersions(versions),)).fit(module, datamodule=dm)


def test_a_step_within_the_bound_trains_and_writes_the_async_tags(tiny_tokenizer):
    module = _module(tiny_tokenizer, k=2, trained_version=5)
    _fit(module, tiny_tokenizer, [5, 4, 3, 5])  # staleness 0, 1, 2, 0, 0, 1, 2, 0 over the 8 rows
    m = module.last_step_context.metrics
    assert module.last_step_context.experience.engine_logprobs is not None
    assert m["async/staleness_mean"] == 0.75 and m["async/staleness_max"] == 2.0
    assert [m[f"async/staleness_frac/{s}"] for s in range(3)] == [0.5, 0.25, 0.25]
    assert 0.0 <= m["async/low_prob_flip_frac/all"] <= 1.0  # eta = algorithm.lopti.eta although Lopti is off
    assert module.rollout_step == 6 and module.trainer.global_step > 0


def test_a_row_older_than_v_minus_k_stops_the_step_before_the_weights_change(tiny_tokenizer):
    module = _module(tiny_tokenizer, k=1, trained_version=5)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    with pytest.raises(StalenessError, match=r"exceed rollout.async.max_staleness=1 \(largest staleness 2\)"):
        _fit(module, tiny_tokenizer, [5, 3])
    assert module.trainer.global_step == 0 and module.rollout_step == 5
    assert all(torch.equal(v, before[k]) for k, v in module.policy.named_parameters())


def test_the_learner_resolves_the_correction_with_the_configs_rule():
    import arlopti.config.rules as rules
    import arlopti.plugins.run_options as run_options  # the learner's seam to the options

    assert run_options.effective_correction_mode is rules.effective_correction_mode
