"""Building what ``rollout.*`` names: an engine (:func:`build_engine`) or a rollout source (:func:`build_rollouts`).

One factory for every caller, beside the engines, so that nothing reaches into a callback to build one:

* :func:`build_rollouts`: the rollout callback's source (:mod:`arlopti.rollout.source`), by
  ``rollout.placement`` and ``rollout.backend``: :class:`~arlopti.rollout.source.HFRollouts`,
  :class:`~arlopti.rollout.source.VLLMRollouts`, or
  :class:`~arlopti.rollout.server_rollouts.ServerRollouts` (the workers always run vLLM; under
  ``placement=server``, ``rollout.backend`` is the engine of the evals that run in the trainer's
  process, and the run says so at start-up);
* :func:`build_engine`: an engine alone, for ``eval.py`` and the benchmark-eval callback (which
  share the colocated source's engine when there is one).

``autocast_dtype`` is the HF engine's autocast (bf16 under a bf16 trainer on a GPU: :func:`autocast_of`);
``device`` the training process's device: given, the vLLM engine starts on it with dummy weights
until the first rollout's sync (training); None, it loads the policy's weights now (``eval.py``
generates at once).
"""

from __future__ import annotations

from pathlib import Path

import torch

from arlopti.config import RolloutConfig
from arlopti.rollout.engine import RolloutEngine
from arlopti.rollout.source import HFRollouts, RolloutSource, SamplingPlan, VLLMRollouts


def autocast_of(precision, device=None) -> torch.dtype | None:
    """The HF engine's autocast dtype under a trainer of this ``precision`` (Lightning's string) on ``device``
    (None: the CPU): bf16 under a bf16 trainer on a CUDA device. None on a CPU: there the engine decodes the
    fp32 master weights on oneDNN-packed copies outside autocast, the fastest path measured (issue 49; RESULTS.md,
    "bf16-mixed against fp32": bf16 autocast cannot use the packed weights and its SDPA is slower)."""
    if "bf16" not in str(precision):
        return None
    return torch.bfloat16 if torch.device(device if device is not None else "cpu").type == "cuda" else None


def build_engine(cfg: RolloutConfig, policy, tokenizer, *, autocast_dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> RolloutEngine:
    """The engine ``cfg.backend`` names for ``policy`` (a :class:`~arlopti.learner.policy.PolicyLM`);
    module docstring for ``autocast_dtype`` and ``device``."""
    if cfg.backend == "hf":
        from arlopti.rollout.hf import HFEngine

        return HFEngine.from_config(cfg, policy, tokenizer, autocast_dtype=autocast_dtype)
    if cfg.backend == "vllm":
        from arlopti.rollout.vllm import VLLMEngine

        if device is None:
            return VLLMEngine.from_policy(policy, tokenizer, cfg)
        return VLLMEngine.from_policy(policy, tokenizer, cfg, first_sync=False, device=device)
    raise ValueError(f"rollout.backend={cfg.backend!r}: use 'hf' or 'vllm'")


def build_rollouts(model_cfg, cfg: RolloutConfig, policy, tokenizer, group_size: int, *, precision="32",
                   device: torch.device | None = None, run_dir: Path | None = None, rank: int = 0, world: int = 1,
                   engine: RolloutEngine | None = None) -> RolloutSource:
    """The rollout source of a training run (module docstring). ``engine``: a colocated engine already
    built (shared with the eval callbacks); ``run_dir``: where spawned rollout workers write their configs
    and logs."""
    if cfg.placement == "server":
        from arlopti.rollout.server_rollouts import ServerRollouts

        return ServerRollouts.start(model_cfg, cfg, policy, tokenizer, group_size,
                                    Path(run_dir or ".") / "rollout_workers", rank=rank, world=world)
    if engine is not None:
        kind = HFRollouts if cfg.backend == "hf" else VLLMRollouts
        return kind(engine, group_size, SamplingPlan.of(cfg, rank))
    if cfg.backend == "hf":
        return HFRollouts.build(cfg, policy, tokenizer, group_size, rank, autocast_dtype=autocast_of(precision, device))
    if cfg.backend == "vllm":
        return VLLMRollouts.build(cfg, policy, tokenizer, group_size, rank, device=device)
    raise ValueError(f"rollout.backend={cfg.backend!r}: use 'hf' or 'vllm'")


__all__ = ["autocast_of", "build_engine", "build_rollouts"]
