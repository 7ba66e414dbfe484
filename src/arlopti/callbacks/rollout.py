"""``RolloutCallback``: the actor side of the loop. It owns the engine and makes the experience.

In ``on_train_batch_start`` it (1) syncs the engine's weights if the learner's
``weight_version`` moved, (2) samples ``sizes.group_size`` responses per prompt of this rank's
share of the batch, (3) scores them with the task reward, and (4) attaches an
:class:`~arlopti.learner.experience.Experience` to the batch as ``batch.experience``. The
learner never calls the engine or a reward: the split is deliberate, so either side can be
swapped (HF ↔ vLLM, K&K ↔ math) without touching the other.

Seeds: the step's sampling seed is derived from ``rollout.seed``, the rollout step and the
rank; each response then gets its own seed from (step seed, prompt, sample), see
:func:`arlopti.rollout.hf.sample_seed`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import lightning.pytorch as L
import torch

from arlopti.config import RolloutConfig
from arlopti.learner.experience import build_experience
from arlopti.rollout.engine import RolloutEngine, SamplingConfig
from arlopti.rollout.hf import sample_seed
from arlopti.tasks.base import Task, get_task

log = logging.getLogger(__name__)


def build_engine(cfg: RolloutConfig, pl_module, trainer=None) -> RolloutEngine:
    """The engine the config names, built from the policy that ``pl_module`` holds."""
    autocast = None
    if trainer is not None and "bf16" in str(trainer.precision):
        autocast = torch.bfloat16
    if cfg.backend == "hf":
        from arlopti.rollout.hf import HFEngine

        return HFEngine(pl_module.policy, pl_module.tokenizer, cfg.generation_batch_size, autocast_dtype=autocast)
    if cfg.backend == "vllm":
        from arlopti.rollout.vllm import VLLMEngine

        return VLLMEngine.from_policy(pl_module.policy, pl_module.tokenizer, cfg)
    raise ValueError(f"rollout.backend={cfg.backend!r}: use 'hf' or 'vllm'")


class RolloutCallback(L.Callback):
    def __init__(self, group_size: int, task_kwargs: dict | None = None):
        self.group_size = group_size
        self.task_kwargs = dict(task_kwargs or {})
        self.engine: RolloutEngine | None = None
        self._tasks: dict[str, Task] = {}

    # the engine is shared with the eval callback through the module
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.engine is None:
            self.engine = getattr(pl_module, "rollout_engine", None) or build_engine(
                pl_module.cfg.rollout, pl_module, trainer)
            pl_module.rollout_engine = self.engine

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = get_task(name, **self.task_kwargs.get(name, {}))
        return self._tasks[name]

    def sampling(self, pl_module, step_seed: int) -> SamplingConfig:
        r = pl_module.cfg.rollout
        return SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.max_new_tokens, stop=tuple(r.stop), seed=step_seed,
                              logprobs=r.return_logprobs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        rank = trainer.global_rank
        step_seed = sample_seed(pl_module.cfg.rollout.seed, pl_module.rollout_step, rank) & 0x7FFFFFFF
        engine = self.engine
        t0 = time.perf_counter()
        engine.wake()
        synced = engine.sync_weights(pl_module.policy, pl_module.weight_version)
        t_sync = time.perf_counter() - t0
        completions = engine.generate(batch.prompt_ids, self.group_size, self.sampling(pl_module, step_seed))
        engine.sleep()
        t_gen = time.perf_counter() - t0 - t_sync
        t1 = time.perf_counter()
        texts = [c.text for cs in completions for c in cs]
        gts = [gt for gt, cs in zip(batch.ground_truths, completions) for _ in cs]
        metas = [m for m, cs in zip(batch.metas, completions) for _ in cs]
        names = [t for t, cs in zip(batch.tasks, completions) for _ in cs]
        results = [None] * len(texts)
        for name in sorted(set(names)):
            idx = [i for i, n in enumerate(names) if n == name]
            scored = self.task(name).score([texts[i] for i in idx], [gts[i] for i in idx], [metas[i] for i in idx])
            for i, res in zip(idx, scored):
                results[i] = res
        t_score = time.perf_counter() - t1
        pad = pl_module.tokenizer.pad_token_id
        exp = build_experience(batch.prompt_ids, completions, results, pad_id=pad,
                               group_offset=rank * len(batch), prompt_texts=batch.prompt_texts,
                               metas=batch.metas)
        exp.timings = {"rollout_s": t_gen, "scoring_s": t_score, "sync_s": t_sync if synced else 0.0}
        batch.experience = exp
