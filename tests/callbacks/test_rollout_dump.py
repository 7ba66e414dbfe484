"""RolloutDumpCallback inside a real (tiny-model) training run: cadence, content, round trip, rank 0 only."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from arlopti.learner.rollout_dump import read_dump, step_records, write_records
from arlopti.callbacks.rollout_dump import RolloutDumpCallback
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


def _cfg() -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3),
                     sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     optim=OptimConfig(lr=1e-3), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))


def test_dump_written_on_schedule_and_decodes_to_the_step(tiny_tokenizer, tmp_path):
    cb = RolloutDumpCallback(dirpath=str(tmp_path), every_n_steps=2, gzip=True)
    module = GRPOModule(_cfg(), tokenizer=tiny_tokenizer, total_rollout_steps=3)
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=[cb]).fit(module, datamodule=dm)
    assert [p.name for p in cb.written] == ["rollouts_step000001.jsonl.gz", "rollouts_step000002.jsonl.gz"]
    rows = read_dump(tmp_path)
    assert sorted({r["step"] for r in rows}) == [1, 2] and len(rows) == 16
    # the last written step is step 2, but the module's context is step 3's: check the codec on it instead
    ctx = module.last_step_context
    recs = step_records(ctx, step=3)
    path = write_records(tmp_path / "s3.jsonl", recs)
    back = read_dump(path)
    exp = ctx.experience
    for i, r in enumerate(back):
        m = exp.response_mask[i].bool()
        assert r["response_ids"].tolist() == exp.response_ids[i][m].tolist()
        assert r["prompt_ids"].tolist() == exp.input_ids[i, :exp.prompt_len][exp.attention_mask[i, :exp.prompt_len]
                                                                              .bool()].tolist()
        assert np.allclose(r["token_probs"], torch.exp(ctx.old_log_probs[i][m]).numpy(), atol=2e-3, rtol=2e-3)
        assert np.allclose(r["advantages"], ctx.advantages[i][m].numpy(), atol=2e-3, rtol=2e-3)
        assert r["reward"] == float(exp.rewards[i]) and r["completion"] == exp.response_texts[i]
        assert r["response_len"] == int(m.sum()) and "distinct" in r["components"]


def test_only_global_rank_zero_writes(tmp_path):
    cb = RolloutDumpCallback(dirpath=str(tmp_path), every_n_steps=1)
    module = types.SimpleNamespace(last_step_context=object(), rollout_step=1)
    cb.on_train_batch_end(types.SimpleNamespace(is_global_zero=False), module, None, None, 0)
    assert cb.written == [] and not list(tmp_path.iterdir())


def test_bad_schedule_is_named(tmp_path):
    with pytest.raises(ValueError, match="every_n_steps=0"):
        RolloutDumpCallback(dirpath=str(tmp_path), every_n_steps=0)
