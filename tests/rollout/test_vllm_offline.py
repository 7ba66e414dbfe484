"""The parts of :class:`arlopti.rollout.vllm.VLLMEngine` that need no vLLM: request layout and
per-sample seeds, sleep bookkeeping (a level-2 sleep forces the next sync), refused settings,
and the install hint when vLLM is missing. A stand-in ``LLM`` records the calls.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from arlopti.config import RolloutConfig
from arlopti.rollout.engine import SamplingConfig


@pytest.fixture(scope="module")
def tok():
    from arlopti.models.loading import build_tiny_tokenizer

    return build_tiny_tokenizer()


# ---------------------------------------------------------------------------------------------
class FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake",))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", prompts, params))
        params = params if isinstance(params, list) else [params] * len(prompts)
        out = []
        for p, sp in zip(prompts, params):
            outs = [SimpleNamespace(token_ids=[7, 8], finish_reason="length", logprobs=None) for _ in range(sp.n)]
            out.append(SimpleNamespace(outputs=outs))
        return out


def _fake_engine(tok, **kw):
    from arlopti.rollout.vllm import VLLMEngine

    eng = VLLMEngine(FakeLLM(), tok, expected_names=[], dtype=torch.float32, tie_word_embeddings=True,
                     max_model_len=64, **kw)
    eng._params = lambda s, n, seed: SimpleNamespace(n=n, seed=seed, temperature=s.temperature)
    return eng


@pytest.mark.parametrize("level,keeps_version", [(1, True), (2, False)])
def test_sleep_level_two_forces_the_next_sync(tok, level, keeps_version):
    eng = _fake_engine(tok, enable_sleep=True, sleep_level=level, sleep_supported=True)
    eng.loaded_version = 5
    eng.sleep()
    eng.sleep()  # idempotent
    assert eng.sleeping and eng.llm.calls == [("sleep", level)]
    with pytest.raises(RuntimeError, match="call wake"):
        eng.generate([[1, 2]], 1, SamplingConfig(max_new_tokens=2))
    eng.wake()
    assert not eng.sleeping and eng.llm.calls[-1] == ("wake",)
    assert (eng.loaded_version == 5) is keeps_version
    calls = []
    eng._load_weights = lambda policy: calls.append(policy)
    assert eng.sync_weights("policy", 5) is (not keeps_version)


def test_sleep_unsupported_is_a_noop(tok):
    eng = _fake_engine(tok, enable_sleep=True, sleep_level=2, sleep_supported=False)
    eng.loaded_version = 3
    eng.sleep()
    eng.wake()
    assert eng.llm.calls == [] and eng.loaded_version == 3


def test_seeded_requests_are_one_per_sample(tok):
    from arlopti.rollout.seeds import sample_seed

    eng = _fake_engine(tok)
    groups = eng.generate([[1, 2], [3]], 3, SamplingConfig(temperature=0.7, max_new_tokens=2, seed=9))
    _, prompts, params = eng.llm.calls[-1]
    assert [p["prompt_token_ids"] for p in prompts] == [[1, 2]] * 3 + [[3]] * 3
    assert [sp.n for sp in params] == [1] * 6
    assert [sp.seed for sp in params] == [sample_seed(9, i, j) for i in range(2) for j in range(3)]
    assert [len(g) for g in groups] == [3, 3]
    eng.generate([[1, 2], [3]], 3, SamplingConfig(temperature=0.7, max_new_tokens=2))  # unseeded: n per request
    _, prompts, params = eng.llm.calls[-1]
    assert len(prompts) == 2 and params.n == 3 and params.seed is None


def test_bad_settings_are_refused(tok):
    from arlopti.rollout.vllm_startup import derive_max_model_len, resolve_dtype

    with pytest.raises(ValueError, match="rollout.dtype='fp8'"):
        resolve_dtype("fp8", torch.float32)
    assert resolve_dtype(None, torch.bfloat16) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.float32) == torch.bfloat16
    assert derive_max_model_len(8192, 16) == 4112
    assert derive_max_model_len(1024, 4096) == 1024
    assert derive_max_model_len(None, 100) == 4196


def test_missing_vllm_says_how_to_install(monkeypatch, tok):
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import TinySpec, build_tiny_model
    from arlopti.config import RunConfig
    from arlopti.rollout.factory import build_engine, build_rollouts

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    module = SimpleNamespace(policy=PolicyLM(build_tiny_model(tok, TinySpec(num_heads=2, num_kv_heads=1))),
                             tokenizer=tok, cfg=RunConfig(rollout=RolloutConfig(backend="vllm")))
    match = r'rollout.backend=vllm needs vLLM.*pip install -e "\.\[cpu\]".*"\.\[gpu\]".*make install'
    with pytest.raises(ImportError, match=match):  # the path train.py takes (RolloutCallback.setup -> build_rollouts)
        build_rollouts(module.cfg.model, module.cfg.rollout, module.policy, tok, 2, device=torch.device("cpu"))
    with pytest.raises(ImportError, match=match):  # the path eval.py takes
        build_engine(RolloutConfig(backend="vllm"), module.policy, tok)


def test_vllm_settings_are_checked_without_vllm():
    from arlopti.rollout.vllm_startup import check_vllm_config

    check_vllm_config(RolloutConfig(backend="vllm"))
    for bad, msg in (({"sleep_level": 3}, "rollout.sleep_level=3"),
                     ({"sync_bucket_mb": -1}, "rollout.sync_bucket_mb=-1"),
                     ({"gpu_memory_utilization": 1.5}, r"rollout.gpu_memory_utilization=1.5 must lie in \(0, 1\]")):
        with pytest.raises(ValueError, match=msg):
            check_vllm_config(RolloutConfig(backend="vllm", **bad))


def test_engine_args_follow_the_config_and_what_this_vllm_accepts():
    from arlopti.rollout.vllm_startup import engine_args

    cfg = RolloutConfig(backend="vllm", seed=3, gpu_memory_utilization=0.5)
    everything = {"logprobs_mode", "use_tqdm_on_load", "enable_sleep_mode", "log_level", "distributed_executor_backend"}
    kw = engine_args("/m", torch.bfloat16, 128, cfg, sleep_mode=True, quiet=True, placement={}, accepted=everything)
    assert kw == dict(model="/m", tokenizer="/m", dtype="bfloat16", seed=3, gpu_memory_utilization=0.5,
                      enforce_eager=True, max_model_len=128, enable_sleep_mode=True, logprobs_mode="processed_logprobs",
                      use_tqdm_on_load=False, disable_log_stats=True, log_level="ERROR", load_format="dummy")
    files = engine_args("/m", torch.bfloat16, 128, cfg, sleep_mode=True, quiet=True, placement={}, accepted=everything,
                        load_format="auto")
    assert files["load_format"] == "auto"  # weights="files": the safetensors written to /m
    loud = engine_args("/m", torch.float32, 128, cfg, sleep_mode=False, quiet=False, placement={}, accepted=set())
    assert not {"logprobs_mode", "use_tqdm_on_load", "enable_sleep_mode", "log_level"} & set(loud)  # an older vLLM
    spread = {"distributed_executor_backend": "external_launcher"}
    kw = engine_args("/m", torch.float32, 128, cfg, sleep_mode=False, quiet=True, placement=spread, accepted=everything)
    assert kw["distributed_executor_backend"] == "external_launcher"
    with pytest.raises(RuntimeError, match="no distributed_executor_backend"):
        engine_args("/m", torch.float32, 128, cfg, sleep_mode=False, quiet=True, placement=spread, accepted=set())
