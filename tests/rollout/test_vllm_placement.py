"""Each rank's colocated vLLM engine on its own GPU (``arlopti.rollout.vllm_startup.engine_placement``).

The rule is checked as a pure function, then end to end through ``VLLMEngine.from_policy`` on 2
gloo ranks with vLLM's platform mocked as CUDA and ``vllm.LLM`` replaced by a stand-in that
records the engine arguments and the environment it was started with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket

import pytest
import torch

from arlopti.rollout.vllm_startup import engine_placement


def test_cuda_with_several_ranks_uses_the_external_launcher_with_this_ranks_env():
    args, env = engine_placement("cuda", world_size=4, rank=5, local_rank=1)
    assert args == {"distributed_executor_backend": "external_launcher"}
    assert env == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}


@pytest.mark.parametrize("device,world", [("cuda", 1), ("cpu", 2), ("cpu", 1)])
def test_one_rank_or_cpu_keeps_the_in_process_executor(device, world):
    assert engine_placement(device, world_size=world, rank=0, local_rank=0) == ({}, {})


def test_under_srun_the_engine_takes_the_trainers_gpu_not_the_global_rank(monkeypatch):
    """Second node's first GPU under ``srun``: global rank 8, ``SLURM_LOCALID=0``, no ``LOCAL_RANK``.
    The old fallback (``LOCAL_RANK``, else the global rank) gave 8: vLLM's ``local_rank <
    device_count`` assertion fails on an 8-GPU node."""
    from arlopti.rollout import vllm_startup as V

    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "8")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 8)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 16)

    def no_current_device():
        raise AssertionError("the trainer's device was given: torch.cuda.current_device() must not be needed")

    monkeypatch.setattr(torch.cuda, "current_device", no_current_device)
    args, env = V.current_placement("cuda", torch.device("cuda", 0))  # what RolloutCallback passes
    assert args == {"distributed_executor_backend": "external_launcher"}
    assert env == {"RANK": "8", "LOCAL_RANK": "0", "WORLD_SIZE": "16"}
    # without the trainer's device: the device Lightning made current (cuda:0 on this rank)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert V.current_placement("cuda")[1]["LOCAL_RANK"] == "0"
    assert V.local_device_index("cuda:3") == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    import sys
    import types

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("LOCAL_RANK", None)  # the engine's GPU comes from the trainer's device, not the environment
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import vllm
        import vllm.engine.arg_utils  # noqa: F401  (imported before the platform is mocked)
        from vllm import platforms

        from arlopti.config import RolloutConfig
        from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer
        from arlopti.rollout.vllm import VLLMEngine

        fake_platform = types.SimpleNamespace(device_type="cuda", is_cpu=lambda: False,
                                              is_sleep_mode_available=lambda: False)
        platforms.current_platform = fake_platform
        seen = {}

        class Recorder:
            def __init__(self, **kwargs):
                seen["kwargs"] = kwargs
                seen["env"] = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
                raise RuntimeError("stand-in engine: arguments recorded")

        vllm.LLM = Recorder
        tok = build_tiny_tokenizer()
        model = build_tiny_model(tok)
        with pytest.raises(RuntimeError, match="arguments recorded"):
            VLLMEngine.from_policy(model, tok, RolloutConfig(backend="vllm", max_new_tokens=8),
                                   device=torch.device("cuda", rank))  # the trainer's root device
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"backend": seen["kwargs"].get("distributed_executor_backend"), "env": seen["env"]}, f)
    finally:
        torch.distributed.destroy_process_group()
        sys.modules.pop("vllm.platforms", None)


@pytest.mark.vllm
@pytest.mark.distributed
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (the cpu extra)")
def test_two_gloo_ranks_with_cuda_mocked_each_start_their_own_engine(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["backend"] == "external_launcher", got
        assert got["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}, got
