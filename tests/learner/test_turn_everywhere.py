"""Multi-turn episodes with the rest of the trainer: exact resume after a SIGTERM (HF rollouts on the tiny model),
LoRA, and DAPO dynamic sampling (its extra rounds run the turn loop too). FSDP2 on 2 ranks: test_turn_fsdp2.py."""

from __future__ import annotations

import pytest
import os
import random
import signal

import lightning.pytorch as L
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.callbacks.rollout import RolloutCallback
from arlopti.config import (AlgorithmConfig, DapoConfig, LoraConfig, ModelConfig, OptimConfig, RolloutConfig,
                            RunConfig, SizesConfig)
from arlopti.config.schema import EnvConfig
from arlopti.learner.module import GRPOModule
from arlopti.tasks.env.loading import register_env
from helpers.moved import assert_moved, snapshot
from helpers.toy import ToyDataModule
from helpers.turns import CountEnv, ScriptedEngine, eos_prone

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

TRAINER = dict(accelerator="cpu", devices=1, logger=False, limit_val_batches=0, num_sanity_val_steps=0,
               use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False)
SIZES = SizesConfig(prompts_per_step=2, group_size=3, mini_batch_size=6, micro_batch_size=3, logprob_micro_batch_size=6)


def trainer(env_cls, *callbacks, group: int = 3, **kw) -> L.Trainer:
    env = EnvConfig(env=register_env(env_cls))
    return L.Trainer(callbacks=[RolloutCallback(group_size=group, env=env), *callbacks],
                     **{**TRAINER, "max_epochs": 1, "enable_checkpointing": False, **kw})


class Rows(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = {k: v for k, v in pl_module.last_step_context.metrics.items() if not k.startswith("timing/")}
        self.rows.append({**m, "step": pl_module.rollout_step, "text": list(batch.experience.response_texts),
                          "ids": batch.experience.input_ids.tolist()})


def resumable(tok, steps, ckpt_dir, ckpt_path=None, stop_at=None):
    L.seed_everything(7, verbose=False)
    # lr 1e-3: step 1's multi-turn episodes score higher (the environment's rewards), and at 1e-2 one update made
    # EOS every turn's first token, so steps 2-3 had one reward per group and nothing to train on (the earlier
    # runs kept their variance only because the outcome reward of an episode with replies was lost: issue 34)
    cfg = RunConfig(sizes=SIZES, optim=OptimConfig(lr=1e-3),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=8, max_turns=3,
                                          max_episode_tokens=96))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    eos_prone(module.policy.hf, tok, 7.0, "Zoey said that Oliver is a knight 3.")  # turns end on EOS: several turns

    class Sigterm(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.rollout_step == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)

    rows = Rows()
    dm = ToyDataModule(n=8, tokenizer=tok, prompts_per_step=2, max_prompt_length=256)
    t = trainer(CountEnv, rows, RolloutCheckpoint(str(ckpt_dir), every_n_steps=None), Sigterm(),
                enable_checkpointing=True, max_epochs=2)
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, rows.rows


def test_a_sigterm_mid_run_then_resume_is_bit_exact(tiny_tokenizer, tmp_path):
    full, rows_full = resumable(tiny_tokenizer, 3, tmp_path / "a")
    assert max(r["turns/max"] for r in rows_full) >= 2 and all(r["reward/zero_std_group_frac"] < 1 for r in rows_full)
    part, rows1 = resumable(tiny_tokenizer, 3, tmp_path / "b", stop_at=1)  # SIGTERM during step 2: saved, stopped
    assert [r["step"] for r in rows1] == [1, 2] and part.preempted
    resumed, rows2 = resumable(tiny_tokenizer, 3, tmp_path / "b", ckpt_path=str(tmp_path / "b" / "last.ckpt"))
    assert [r["step"] for r in rows2] == [3]
    assert rows_full == rows1 + rows2  # every metric, text and id of every step
    a, b = full.policy.state_dict(), resumed.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    print(assert_moved(snapshot(part.policy), resumed.policy, resumed.trainer.optimizers[0], what="step 3, resumed"))


def ragged(tok, ctx, seed):
    """Two turns of seeded letters, then ``done`` and 0-5 more (the final answer's letters, so its toy reward, vary)."""
    rng = random.Random(seed)
    k = tok.decode(ctx, skip_special_tokens=False).count("ok ")
    if k >= 2:
        return "done" + "".join(rng.choice("wxyz") for _ in range(rng.randint(0, 5))), False
    return "".join(rng.choice("abcdef") for _ in range(5)), False


def test_lora_trains_its_adapter_on_multi_turn_episodes(tiny_tokenizer):
    torch.manual_seed(0)
    cfg = RunConfig(sizes=SIZES, optim=OptimConfig(lr=1e-2), model=ModelConfig(lora=LoraConfig(r=4, alpha=8)),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=16, max_turns=3,
                                          max_episode_tokens=128))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    module.rollout_engine = ScriptedEngine(tiny_tokenizer, ragged)
    before = snapshot(module.policy)
    rows = Rows()
    trainer(CountEnv, rows).fit(module, datamodule=ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2,
                                                                 max_prompt_length=256))
    assert rows.rows[0]["turns/mean"] == 3.0 and rows.rows[0]["turns/later_turns/tokens"] > 0
    print(assert_moved(before, module.policy, module.trainer.optimizers[0], what="LoRA, multi-turn"))


def test_dynamic_sampling_runs_its_extra_rounds_through_the_turn_loop(tiny_tokenizer):
    from helpers.flat_toy import FlatToyDataModule

    torch.manual_seed(0)
    cfg = RunConfig(algorithm=AlgorithmConfig(dapo=DapoConfig(dynamic_sampling=True, max_gen_batches=4)),
                    sizes=SIZES, optim=OptimConfig(lr=1e-2),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=16, max_turns=3,
                                          max_episode_tokens=128))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    engine = module.rollout_engine = ScriptedEngine(tiny_tokenizer, ragged)
    rows = Rows()
    cb = trainer(CountEnv, rows)
    dm = FlatToyDataModule(n=8, flat={0, 1, 2}, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256,
                           shuffle=False)
    cb.fit(module, datamodule=dm)
    m = rows.rows[0]
    assert m["dapo/gen_rounds"] >= 2 and m["dapo/groups_trained"] == 2 and m["turns/mean"] == 3.0
    rounds = [c for c in engine.calls if c[1] == 3]  # turn 0 of each round: G = 3 per prompt
    assert len(rounds) == m["dapo/gen_rounds"] and len(engine.calls) == 3 * len(rounds)
