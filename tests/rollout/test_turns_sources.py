"""Multi-turn episodes through the rollout sources: the server placement's pooled workers give the colocated
episodes (the same seeds however the running episodes are split), and the HF engine runs the loop on a model."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch

from arlopti.config import RolloutConfig, ServerConfig
from arlopti.config.schema import EnvConfig
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.server_client import RolloutWorker
from arlopti.rollout.server_rollouts import Batch, ServerRollouts
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env.loading import register_env
from helpers.turns import CountEnv, ScriptedEngine, eos_prone, turn_number
from rollout.test_turns import batch_of

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5, logprobs=True)


def uneven(tok, ctx, seed):
    """Episodes of 1 to 3 turns: the seed decides when one says done, so later turns run on a shrinking set."""
    k = turn_number(tok, ctx)
    return ("done" if seed % 3 <= k else f"t{k}{seed % 7}"), False


def loop_of(tok, turns=4):
    return build_turn_loop(RolloutConfig(max_turns=turns, max_new_tokens=16), EnvConfig(env=register_env(CountEnv)),
                           tok)


def test_the_workers_split_every_turn_and_give_the_colocated_episodes(tiny_tokenizer, monkeypatch):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok, uneven)
    calls = []

    def worker_generate(self, prompts, first, n, sampling, tokenizer, pool):
        calls.append((self.name, first, len(prompts), n))
        return engine.generate(prompts, n, sampling, first=first)

    monkeypatch.setattr(RolloutWorker, "generate", worker_generate)
    batch = batch_of(tok, 5)
    colocated = collect_groups(engine.generate, batch.prompt_ids, 3, SAMPLING, turns=loop_of(tok), batch=batch)
    workers = [RolloutWorker.remote(f"h{i}:1", ServerConfig()) for i in range(2)]
    pool = ServerRollouts(workers, RolloutConfig(placement="server", max_turns=4), "arlopti-x", tokenizer=tok,
                          group_size=3)
    pool.turns = loop_of(tok)
    b = Batch(0, batch, 7, Future())
    served = pool._generate(b, SAMPLING)
    pool.close()
    assert [[(e.token_ids, e.trainable, e.logprobs) for e in g] for g in served] == \
        [[(e.token_ids, e.trainable, e.logprobs) for e in g] for g in colocated]
    assert {e.meta["turns"] for g in served for e in g} == {1, 2, 3} and all(e.version == 7 for g in served for e in g)
    # turn 0: the 5 prompts in whole groups; later turns: the running episodes, split again between both workers
    assert calls[:2] == [("http://h0:1", 0, 3, 3), ("http://h1:1", 3, 2, 3)] and len(calls) > 2
    assert {n for *_, n in calls[2:]} == {1} and {w for w, *_ in calls[2:]} == {"http://h0:1", "http://h1:1"}
    assert b.stats["worker0/tokens_per_s"] > 0


def test_the_hf_engine_runs_the_turns_on_its_own_samples(tiny_tokenizer, tiny_model):
    from arlopti.rollout.hf import HFEngine

    tok = tiny_tokenizer
    eos_prone(tiny_model, tok)
    engine = HFEngine(tiny_model, tok, generation_batch_size=8)
    seen = []

    def generate(prompts, n, s):
        out = engine.generate(prompts, n, s)
        seen.append((prompts, out))
        return out

    batch = batch_of(tok, 2)
    groups = collect_groups(generate, batch.prompt_ids, 2, SAMPLING, turns=loop_of(tok, 3), batch=batch)
    episodes = [e for g in groups for e in g]
    assert max(e.meta["turns"] for e in episodes) >= 2
    for prompts, outs in seen[1:]:  # a later turn's context is the prompt and the episode so far, as ids
        for ctx, (c,) in zip(prompts, outs):
            owner = [e for e, i in zip(episodes, [0, 0, 1, 1])
                     if ctx == batch.prompt_ids[i] + e.token_ids[:len(ctx) - len(batch.prompt_ids[i])]]
            assert owner, "every context continues an episode"
            e = owner[0]
            start = len(ctx) - len(batch.prompt_ids[episodes.index(e) // 2])
            assert e.token_ids[start:start + len(c.token_ids)] == c.token_ids
            assert e.logprobs[start:start + len(c.token_ids)] == c.logprobs
    for e in episodes:
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.trainable) if not m)


def test_the_trainer_reads_the_engines_log_probs_at_the_same_positions(tiny_tokenizer, tiny_model):
    """The experience of multi-turn episodes: the trainer's log-probs of the sampled tokens (replies in between
    as context) equal the HF engine's own, and the environment's positions are masked out."""
    from arlopti.learner.experience import build_experience
    from arlopti.learner.policy import PolicyLM
    from arlopti.rollout.hf import HFEngine
    from arlopti.tasks.base import RewardResult

    tok = tiny_tokenizer
    eos_prone(tiny_model, tok)
    policy = PolicyLM(tiny_model)
    batch = batch_of(tok, 2)
    groups = collect_groups(HFEngine(policy, tok, 8).generate, batch.prompt_ids, 2, SAMPLING,
                            turns=loop_of(tok, 3), batch=batch)
    results = [RewardResult(0.0, False) for g in groups for _ in g]
    exp = build_experience(batch.prompt_ids, groups, results, pad_id=tok.pad_token_id)
    assert int(exp.turn_index.max()) >= 1
    with torch.no_grad():
        lp, _ = policy(exp.input_ids, exp.attention_mask, exp.prompt_len, SAMPLING.temperature, with_entropy=False)
    sampled = exp.response_mask.bool()
    gap = (lp - exp.engine_logprobs).abs()
    assert float(gap[sampled].max()) < 1e-4
    assert bool((exp.engine_logprobs[~sampled] == 0).all())
