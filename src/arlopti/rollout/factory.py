"""The rollout engine that ``rollout.backend`` names, built from a policy and its tokenizer.

One factory for every caller: the rollout callback (training: :func:`arlopti.callbacks.rollout.engine_for`
passes the trainer's precision and device), ``eval.py`` and the benchmark-eval callback. It lives
here, beside the engines, so that nothing reaches into a callback to build one.
"""

from __future__ import annotations

import torch

from arlopti.config import RolloutConfig
from arlopti.rollout.engine import RolloutEngine


def build_engine(cfg: RolloutConfig, policy, tokenizer, *, autocast_dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> RolloutEngine:
    """The engine ``cfg.backend`` names for ``policy`` (a :class:`~arlopti.learner.policy.PolicyLM`).

    ``autocast_dtype``: the HF engine's autocast (bf16 under a bf16 trainer). ``device``: the
    training process's device; given, the vLLM engine starts on it with dummy weights until the
    first rollout's sync (training); None, it loads the policy's weights now (``eval.py``
    generates at once).
    """
    if cfg.backend == "hf":
        from arlopti.rollout.hf import HFEngine

        return HFEngine(policy, tokenizer, cfg.generation_batch_size, autocast_dtype=autocast_dtype,
                        decoder=cfg.hf_decoder)
    if cfg.backend == "vllm":
        from arlopti.rollout.vllm import VLLMEngine

        if device is None:
            return VLLMEngine.from_policy(policy, tokenizer, cfg)
        return VLLMEngine.from_policy(policy, tokenizer, cfg, first_sync=False, device=device)
    raise ValueError(f"rollout.backend={cfg.backend!r}: use 'hf' or 'vllm'")


__all__ = ["build_engine"]
