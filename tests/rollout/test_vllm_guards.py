"""The GPU-path fixes that need no vLLM (../shared/notes/gpu_path_review.md): the engine config's
dropped keys, the staged wake (weights, sync, KV cache), the rollout's freed gradients, the
refused ``cpu_offload`` sync, and the guard against generating from dummy weights. Stand-ins
record the calls.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from arlopti.config import ConfigError, RolloutConfig, RunConfig, check_rollout_offload
from arlopti.rollout.engine import RolloutEngine, SamplingConfig
from arlopti.rollout.source import SamplingPlan, VLLMRollouts


@pytest.fixture(scope="module")
def tok():
    from arlopti.models.loading import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_engine_config_drops_only_the_attention_changing_keys():
    from arlopti.rollout.vllm_startup import engine_config

    cfg = {"model_type": "qwen2", "max_position_embeddings": 1010000, "sliding_window": 32768,
           "dual_chunk_attention_config": {"chunk_size": 262144}}
    kept, removed = engine_config(cfg)
    assert removed == ["dual_chunk_attention_config"]
    assert kept == {k: v for k, v in cfg.items() if k != "dual_chunk_attention_config"}
    assert engine_config({"model_type": "llama"}) == ({"model_type": "llama"}, [])


class RecordingLLM:
    def __init__(self, log):
        self.log = log

    def sleep(self, level):
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tags))
        return tags is None or "kv_cache" in tags


def _engine(tok, log, level):
    from arlopti.rollout.vllm import VLLMEngine

    eng = VLLMEngine(RecordingLLM(log), tok, expected_names=[], dtype=torch.float32, tie_word_embeddings=True,
                     max_model_len=64, enable_sleep=True, sleep_level=level, sleep_supported=True)

    def load(policy):
        log.append(("sync",))
        eng.weights_loaded = True

    eng._load_weights = load
    return eng


@pytest.mark.parametrize("level,expect_sync", [(2, True), (1, False)])
def test_wake_in_stages_weights_then_sync_then_kv_cache(tok, level, expect_sync):
    log: list = []
    eng = _engine(tok, log, level)
    eng.loaded_version = 4
    eng.sleep()
    assert eng.weights_loaded is (level == 1)  # level 2 drops them
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate([[1, 2]], 1, SamplingConfig(temperature=0, max_new_tokens=2))
    assert eng.wake_and_sync(None, 4) is expect_sync  # same version: only level 2 must reload
    middle = [("sync",)] if expect_sync else []
    assert log == [("sleep", level), ("wake_up", ["weights"]), *middle, ("wake_up", ["kv_cache"])]
    assert not eng.sleeping and eng.weights_loaded


def test_an_awake_engine_only_syncs(tok):
    log: list = []
    eng = _engine(tok, log, 2)
    assert eng.wake_and_sync(None, 1) and log == [("sync",)]
    assert not eng.wake_and_sync(None, 1) and log == [("sync",)]


def test_generate_refuses_dummy_weights_until_the_first_sync(tok):
    log: list = []
    eng = _engine(tok, log, 2)
    eng.weights_loaded = False  # what from_policy leaves after a dummy start without first_sync
    with pytest.raises(RuntimeError, match="call sync_weights"):
        eng.generate([[1, 2]], 1, SamplingConfig(temperature=0, max_new_tokens=2))


class _Stop(Exception):
    pass


def test_the_rollout_frees_the_gradients_before_it_wakes_the_engine(tok):
    from arlopti.callbacks.rollout import RolloutCallback

    log: list = []

    class Spy(RolloutEngine):
        def wake_and_sync(self, policy, version):
            log.append(("wake_and_sync", version))
            return False

        def generate(self, prompt_ids, n, sampling):
            raise _Stop

    class Opt:
        def zero_grad(self, set_to_none=False):
            log.append(("zero_grad", set_to_none))

    cb = RolloutCallback(group_size=2)
    cb.source = VLLMRollouts(Spy(), 2, SamplingPlan.of(RunConfig().rollout))
    module = SimpleNamespace(cfg=RunConfig(), rollout_step=0, weight_version=3, policy=None, tokenizer=tok)
    trainer = SimpleNamespace(global_rank=0, world_size=1, optimizers=[Opt()])
    with pytest.raises(_Stop):
        cb.on_train_batch_start(trainer, module, SimpleNamespace(prompt_ids=[[1, 2]]), 0)
    assert log == [("zero_grad", True), ("wake_and_sync", 3)]


def test_vllm_with_cpu_offload_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"rollout.backend=vllm.*trainer.strategy.cpu_offload=true"):
        check_rollout_offload("vllm", True)
    check_rollout_offload("hf", True)  # the HF engine generates on the live module: no gather
    check_rollout_offload("vllm", False)


def test_the_rollout_callback_refuses_the_offload_sync_before_building_a_source(monkeypatch):
    import arlopti.callbacks.rollout as R
    from arlopti.learner.sharding import FSDPOptions

    def never(*a, **k):
        raise AssertionError("the engine must not be built")

    monkeypatch.setattr(R, "build_rollouts", never)
    module = SimpleNamespace(cfg=RunConfig(rollout=RolloutConfig(backend="vllm")), rollout_engine=None)
    trainer = SimpleNamespace(strategy=SimpleNamespace(fsdp_options=FSDPOptions(cpu_offload=True)))
    with pytest.raises(ConfigError, match="trainer.strategy.cpu_offload"):
        R.RolloutCallback(group_size=2).setup(trainer, module, "fit")
