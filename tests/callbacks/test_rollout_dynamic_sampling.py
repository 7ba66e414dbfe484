"""DAPO in the rollout callback: overlong shaping, dynamic sampling's rounds, selection, stats and
resume; and a GRPO step on fewer groups than ``prompts_per_step``.

The callback is driven directly (a stand-in trainer and module: it reads nothing else) with
:class:`helpers.flat_toy.SpyEngine`, whose fixed responses depend only on the prompt, and the
``flat_toy`` task, whose flat prompts score 0 on every response (no signal). The expected rounds,
groups and fractions are worked out from the spy's record of which prompts were generated and
the known flat set. 1 rank = 2 ranks: tests/distributed/test_dynamic_sampling.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.callbacks.rollout import RolloutCallback
from arlopti.rollout.seeds import step_seed
from arlopti.rollout.source import HFRollouts, SamplingPlan
from arlopti.config import AlgorithmConfig, DapoConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from helpers.flat_toy import FlatToyDataModule, SpyEngine, prompt_index

P, G = 4, 4


def make_cfg(max_gen_batches: int = 3, dynamic: bool = True, buffer: int = 0, mini: int = P * G) -> RunConfig:
    dapo = DapoConfig(dynamic_sampling=dynamic, max_gen_batches=max_gen_batches, overlong_buffer=buffer)
    return RunConfig(algorithm=AlgorithmConfig(dapo=dapo),
                     sizes=SizesConfig(prompts_per_step=P, group_size=G, mini_batch_size=mini, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=10))


def rollout_once(tok, cfg: RunConfig, flat, n: int = 16, step: int = 0):
    """One ``on_train_batch_start`` on the first batch: (experience, spy engine, main batch)."""
    dm = FlatToyDataModule(n=n, flat=flat, tokenizer=tok, prompts_per_step=P, max_prompt_length=256)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    spy = SpyEngine(tok)
    cb = RolloutCallback(group_size=G)
    cb.source = HFRollouts(spy, G, SamplingPlan.of(cfg.rollout))
    module = SimpleNamespace(cfg=cfg, rollout_step=step, weight_version=0, policy=None, tokenizer=tok)
    trainer = SimpleNamespace(global_rank=0, world_size=1, datamodule=dm)
    cb.on_train_batch_start(trainer, module, batch, 0)
    return batch.experience, spy, batch


def trained_prompts(exp) -> list[int]:
    """The prompt index of each group of the experience, in row order."""
    assert all(exp.prompt_texts[i] == exp.prompt_texts[i - i % G] for i in range(len(exp)))
    return [prompt_index(exp.prompt_texts[i]) for i in range(0, len(exp), G)]


def expected(calls: list[list[int]], flat: set[int], max_rounds: int) -> tuple[int, list[int], int]:
    """By hand: (rounds, trained prompts, groups with signal) from the generated prompts."""
    kept, rounds = [], 0
    for prompts in calls[:max_rounds]:
        rounds += 1
        kept += [i for i in prompts if i not in flat]
        if len(kept) >= P:
            break
    return rounds, kept[:P], len(kept)


def test_groups_whose_rewards_are_all_equal_are_dropped_and_more_prompts_drawn(tiny_tokenizer):
    flat = set(range(0, 16, 2)) | {1, 3}  # 6 of 16 prompts carry signal
    exp, spy, batch = rollout_once(tiny_tokenizer, make_cfg(max_gen_batches=5), flat)
    assert spy.calls[0] == [prompt_index(t) for t in batch.prompt_texts]  # round 0 is the main batch
    assert len(spy.calls) >= 2, "the flat set must force a second round"
    assert not set(spy.calls[1]) & set(spy.calls[0]), "a step's extra prompts avoid its main batch"
    rounds, prompts, kept = expected(spy.calls, flat, 5)
    assert len(spy.calls) == rounds
    assert trained_prompts(exp) == prompts and len(prompts) == P
    for g in range(P):  # every trained group carries signal
        r = exp.rewards[g * G:(g + 1) * G]
        assert r.max() > r.min()
    assert exp.group_ids.tolist() == [g for g in range(P) for _ in range(G)]
    assert exp.sampling_stats == {"gen_rounds": rounds, "groups_generated": rounds * P,
                                  "kept_frac": kept / (rounds * P),
                                  "groups_trained": P, "no_signal_fallback": 0.0}


def test_rounds_stop_at_max_gen_batches_then_train_on_what_there_is(tiny_tokenizer):
    flat = set(range(16)) - {5}  # one prompt of 16 carries signal
    exp, spy, batch = rollout_once(tiny_tokenizer, make_cfg(max_gen_batches=3), flat)
    assert len(spy.calls) == 3
    assert sum(i not in flat for c in spy.calls for i in c) == 1, "prompt 5 is drawn once in the 3 rounds"
    assert exp.sampling_stats == {"gen_rounds": 3, "groups_generated": 3 * P, "kept_frac": 1 / 12, "groups_trained": 1,
                                  "no_signal_fallback": 0.0}
    assert trained_prompts(exp) == [5] and exp.group_ids.tolist() == [0] * G


def test_no_group_with_signal_falls_back_to_the_main_batch(tiny_tokenizer):
    exp, spy, batch = rollout_once(tiny_tokenizer, make_cfg(max_gen_batches=2), flat=range(16))
    assert len(spy.calls) == 2
    assert trained_prompts(exp) == spy.calls[0] == [prompt_index(t) for t in batch.prompt_texts]
    assert exp.sampling_stats == {"gen_rounds": 2, "groups_generated": 2 * P, "kept_frac": 0.0, "groups_trained": P,
                                  "no_signal_fallback": 1.0}
    assert float(exp.rewards.abs().sum()) == 0.0


def test_all_groups_with_signal_is_the_plain_rollout(tiny_tokenizer):
    on, spy, _ = rollout_once(tiny_tokenizer, make_cfg(), flat=())
    off, _, _ = rollout_once(tiny_tokenizer, make_cfg(dynamic=False), flat=())
    assert len(spy.calls) == 1 and on.sampling_stats["kept_frac"] == 1.0 and off.sampling_stats == {}
    for name in ("input_ids", "rewards", "group_ids", "response_mask"):
        assert torch.equal(getattr(on, name), getattr(off, name)), name


def test_extra_prompts_are_a_pure_function_of_the_data_position(tiny_tokenizer):
    """What a resumed run relies on: a fresh DataModule, positioned by a restored state, draws the same
    extra prompts for the same step; another step (or round) draws others."""
    def dm(world=1, rank=0):
        d = FlatToyDataModule(n=16, tokenizer=tiny_tokenizer, prompts_per_step=P, max_prompt_length=256)
        d.setup()
        d._sampler.world_size, d._sampler.rank = world, rank
        return d

    a, b = dm(), dm()
    b.load_state_dict(a.state_dict())
    assert a.extra_batch((0, 1), 1).uids == b.extra_batch((0, 1), 1).uids
    assert a.extra_batch((0, 1), 1).uids != a.extra_batch((0, 2), 1).uids
    assert a.extra_batch((0, 1), 1).uids != a.extra_batch((0, 1), 2).uids
    # rank r of 2 takes its contiguous half of the same global draw
    halves = dm(2, 0).extra_batch((0, 1), 2).uids + dm(2, 1).extra_batch((0, 1), 2).uids
    assert halves == a.extra_batch((0, 1), 2).uids
    assert a.extra_batch((0, 1), 2).position == (0, 1)
    with pytest.raises(ValueError, match="round 0 is the main batch"):
        a._sampler.extra_indices((0, 0), 0)


def test_round_seeds():
    assert step_seed(7, 3, 1) == step_seed(7, 3, 1, 0)  # round 0: the step seed, as before
    seeds = {step_seed(7, 3, 1, k) for k in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2 ** 31 for s in seeds)


def test_overlong_shaping_is_added_and_logged_as_a_component(tiny_tokenizer):
    # L_max = 10, buffer 4: a response of n tokens loses max(0, n - 6) / 4
    exp, _, _ = rollout_once(tiny_tokenizer, make_cfg(dynamic=False, buffer=4), flat=())
    plain, _, _ = rollout_once(tiny_tokenizer, make_cfg(dynamic=False), flat=())
    lengths = exp.response_mask.sum(-1)
    pen = torch.tensor([-max(0.0, float(n) - 6) / 4 for n in lengths])
    assert (pen < 0).any() and (pen == 0).any(), "the fixed responses must fall on both sides of the buffer"
    torch.testing.assert_close(exp.components["overlong_penalty"], pen)
    torch.testing.assert_close(exp.rewards, plain.rewards + pen)
    assert "overlong_penalty" not in plain.components


class Record(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        exp = batch.experience
        self.rows.append({"metrics": dict(pl_module.last_step_context.metrics), "prompts": trained_prompts(exp),
                          "rows": len(exp)})


def fit(tok, cfg, flat, steps, ckpt_dir=None, ckpt_path=None):
    from arlopti.learner.module import GRPOModule

    L.seed_everything(3, verbose=False)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    spy = module.rollout_engine = SpyEngine(tok)
    dm = FlatToyDataModule(n=16, flat=flat, tokenizer=tok, prompts_per_step=P, max_prompt_length=256)
    rec = Record()
    cbs = [RolloutCallback(group_size=G), rec]
    if ckpt_dir:
        cbs.append(RolloutCheckpoint(str(ckpt_dir), every_n_steps=1))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=bool(ckpt_dir),
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=cbs)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, rec, spy


def test_the_learner_trains_on_fewer_groups_and_logs_the_stats_and_resume_draws_the_same_prompts(tiny_tokenizer,
                                                                                                  tmp_path):
    """3 groups with signal where P = 4 (12 rows, mini-batches of 8: the last one holds 4), the
    dapo/* tags, and 2 steps = 1 step + resume + 1 step (same prompts, same metrics)."""
    flat = set(range(16)) - {1, 6, 11}
    cfg = make_cfg(max_gen_batches=4, mini=8)
    module, rec, spy = fit(tiny_tokenizer, cfg, flat, 2, tmp_path / "a")
    first = rec.rows[0]
    assert first["prompts"] == [i for c in spy.calls[:4] for i in c if i not in flat][:P]
    k = len(first["prompts"])
    assert 0 < k < P and first["rows"] == k * G, "the flat set leaves fewer than P groups with signal"
    m = first["metrics"]
    assert m["dapo/gen_rounds"] == 4 and m["dapo/groups_generated"] == 4 * P and m["dapo/groups_trained"] == k
    assert m["dapo/kept_frac"] == k / (4 * P) and m["dapo/no_signal_fallback"] == 0.0
    assert m["update/steps"] == 2 and m["rollout/responses"] == k * G  # mini-batches of 8 and 4 rows
    # resume: step 2 of a run resumed after step 1 draws and trains on the same prompts
    _, rec1, _ = fit(tiny_tokenizer, cfg, flat, 1, tmp_path / "b")
    _, rec2, spy2 = fit(tiny_tokenizer, cfg, flat, 2, tmp_path / "b", ckpt_path=str(tmp_path / "b" / "last.ckpt"))
    assert spy2.calls == spy.calls[len(spy.calls) - len(spy2.calls):] and len(spy2.calls) >= 1
    assert rec2.rows[0]["prompts"] == rec.rows[1]["prompts"]
    a, b = rec.rows[1]["metrics"], rec2.rows[0]["metrics"]
    diff = {key: (a[key], b[key]) for key in a if not key.startswith("timing/") and a[key] != b[key]}
    assert not diff, f"step 2 differs after resume: {diff}"
