"""``RolloutCallback``: the actor side of the loop. It owns the engine and makes the experience.

In ``on_train_batch_start`` it (1) frees the previous update's gradients
(``zero_grad(set_to_none=True)``: the learner zeroes them before every mini-batch anyway, and on
7B over 4 GPUs they are 7.6 GB per GPU that vLLM can use), wakes the engine and syncs its weights
if the learner's ``weight_version`` moved (:meth:`~arlopti.rollout.engine.RolloutEngine.wake_and_sync`;
vLLM wakes its weights, syncs, then wakes its KV cache), (2) samples ``sizes.group_size`` responses per prompt of this rank's
share of the batch, (3) scores them with the task reward (plus DAPO's overlong shaping when
``algorithm.dapo.overlong_buffer > 0``: :func:`arlopti.algorithms.dapo.overlong_penalty`, with
``L_max = rollout.max_new_tokens`` and lengths in response tokens, logged as the reward component
``overlong_penalty``), (4) with ``algorithm.dapo.dynamic_sampling`` keeps only the groups that
carry signal, sampling more prompts until enough do (below), and (5) attaches an
:class:`~arlopti.learner.experience.Experience` to the batch as ``batch.experience``. The
learner never calls the engine or a reward: the split is deliberate, so either side can be
swapped (HF ↔ vLLM, K&K ↔ math) without touching the other.

Seeds: the step's sampling seed is derived from ``rollout.seed``, the rollout step and the
rank; each response then gets its own seed from (step seed, prompt, sample), see
:func:`arlopti.rollout.hf.sample_seed`. Dynamic sampling's round ``k >= 1`` derives its own
seed from the step seed and ``k`` (:func:`round_seed`); round 0 is the step seed itself.

Dynamic sampling (DAPO §3.2; :mod:`arlopti.algorithms.dapo`, run by
:mod:`arlopti.algorithms.dynamic_sampling`), exact under data parallelism:

* round 0 is the step's batch; round ``k >= 1`` is ``P`` more prompts over all ranks from
  :meth:`arlopti.data.prompt_datamodule.PromptDataModule.extra_batch` (a pure function of the
  seed, the step's data position and ``k``, so a resumed run draws the same prompts);
* after each round the ranks all-gather their groups' signal flags (rewards not all equal), so
  every rank sees the same global list and takes the same decision: another round while fewer
  than ``P = sizes.prompts_per_step`` groups carry signal and fewer than
  ``algorithm.dapo.max_gen_batches`` rounds ran;
* the step trains on the first ``P`` groups with signal in generation order (round, then global
  prompt index), cut to a multiple of the world size, and rank ``r`` takes the ``r``-th
  contiguous share: the groups a rank trains on may have been generated on another rank, and
  are moved there (one ``all_gather_object`` of the groups that change rank). The trained set
  therefore depends on the global rollout only, not on the number of ranks (1 rank = N ranks,
  tests/distributed/test_dynamic_sampling.py), and every rank holds the same number of groups;
* fewer than ``P`` after the last round: train on those (fewer rows, so the last mini-batch may
  be smaller); none (or fewer than the world size): train on round 0's groups unfiltered, logged
  as ``dapo/no_signal_fallback`` (:func:`arlopti.algorithms.dapo.select_groups` says why).

Logged every step (``Experience.sampling_stats`` → ``dapo/*``, docs/metrics.md): the generation
rounds, the groups generated, the kept fraction (groups with signal / groups generated) and the
groups trained on. ``batch``'s own prompt lists still describe the main batch; the experience
holds the groups trained on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import lightning.pytorch as L
import torch

from arlopti.algorithms.dapo import overlong_penalty
from arlopti.algorithms.dynamic_sampling import dynamic_sampling
from arlopti.config import check_rollout_offload
from arlopti.learner.experience import build_experience
from arlopti.rollout.engine import Completion, RolloutEngine, SamplingConfig
from arlopti.rollout.factory import build_engine
from arlopti.rollout.hf import sample_seed
from arlopti.tasks.base import RewardResult, Task, get_task


def engine_for(trainer, pl_module) -> RolloutEngine:
    """The training engine of ``pl_module``'s policy (:func:`arlopti.rollout.factory.build_engine`),
    with the trainer's precision (bf16 autocast for HF) and its device (vLLM's placement)."""
    autocast = torch.bfloat16 if "bf16" in str(trainer.precision) else None
    return build_engine(pl_module.cfg.rollout, pl_module.policy, pl_module.tokenizer, autocast_dtype=autocast,
                        device=trainer.strategy.root_device)


def round_seed(base: int, rollout_step: int, rank: int, round_index: int = 0) -> int:
    """The sampling seed of one generation round: round 0 is the step seed
    ``sample_seed(base, rollout_step, rank)``, round ``k >= 1`` is ``sample_seed(step seed, k, 0)``
    (31 bits)."""
    step = sample_seed(base, rollout_step, rank) & 0x7FFFFFFF
    return step if round_index == 0 else sample_seed(step, round_index, 0) & 0x7FFFFFFF


@dataclass
class Group:
    """One prompt and its scored responses (what dynamic sampling keeps, drops or moves)."""

    prompt_ids: list[int]
    prompt_text: str
    meta: dict
    completions: list[Completion]
    results: list[RewardResult]


def shape_overlong(results: list[RewardResult], lengths: list[int], max_len: int, buffer: int,
                   factor: float) -> list[RewardResult]:
    """The results with DAPO's overlong penalty added to each reward and recorded as the component
    ``overlong_penalty`` (:func:`arlopti.algorithms.dapo.overlong_penalty`)."""
    pen = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor).tolist()
    return [replace(r, reward=r.reward + p, components={**r.components, "overlong_penalty": p})
            for r, p in zip(results, pen)]


class RolloutCallback(L.Callback):
    def __init__(self, group_size: int, task_kwargs: dict | None = None):
        self.group_size = group_size
        self.task_kwargs = dict(task_kwargs or {})
        self.engine: RolloutEngine | None = None
        self.server = None  # rollout.placement=server: arlopti.rollout.server_rollouts.ServerRollouts
        self._tasks: dict[str, Task] = {}

    # the engine is shared with the eval callback through the module
    def setup(self, trainer, pl_module, stage: str) -> None:
        if pl_module.cfg.rollout.placement == "server":
            if self.server is None and stage == "fit":
                from arlopti.callbacks.server_placement import start_server_rollouts

                self.server = start_server_rollouts(trainer, pl_module, self.group_size)
            return
        offload = getattr(getattr(getattr(trainer, "strategy", None), "fsdp_options", None), "cpu_offload", False)
        check_rollout_offload(pl_module.cfg.rollout.backend, bool(offload))
        if self.engine is None:
            self.engine = getattr(pl_module, "rollout_engine", None) or engine_for(trainer, pl_module)
            pl_module.rollout_engine = self.engine

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()
        if self.server is not None:
            self.server.close()
            self.server = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.server is not None:  # no rollout worker outlives a failed run
            self.server.close()
            self.server = None

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = get_task(name, **(self.task_kwargs.get(name) or {}))
        return self._tasks[name]

    def sampling(self, pl_module, step_seed: int) -> SamplingConfig:
        r = pl_module.cfg.rollout
        return SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.max_new_tokens, stop=tuple(r.stop), seed=step_seed,
                              logprobs=r.return_logprobs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        rank = trainer.global_rank
        engine = self.engine
        timings = {"rollout_s": 0.0, "scoring_s": 0.0, "sync_s": 0.0}
        for opt in getattr(trainer, "optimizers", ()):  # gradients are not needed until the update: free them
            opt.zero_grad(set_to_none=True)
        if self.server is not None:
            from arlopti.callbacks.server_placement import server_experience

            batch.experience = server_experience(self, trainer, pl_module, batch)
            return
        t0 = time.perf_counter()
        if engine.wake_and_sync(pl_module.policy, pl_module.weight_version):
            timings["sync_s"] = time.perf_counter() - t0
        seed = round_seed(pl_module.cfg.rollout.seed, pl_module.rollout_step, rank)
        groups = self.generate_and_score(batch, pl_module, seed, timings)
        stats: dict[str, float] = {}
        if pl_module.cfg.algorithm.dapo.dynamic_sampling:
            groups, stats = self.dynamic_sampling(trainer, pl_module, batch, groups, timings)
        t1 = time.perf_counter()
        engine.sleep()
        timings["rollout_s"] += time.perf_counter() - t1
        exp = build_experience([g.prompt_ids for g in groups], [g.completions for g in groups],
                               [r for g in groups for r in g.results], pad_id=pl_module.tokenizer.pad_token_id,
                               group_offset=rank * len(groups), prompt_texts=[g.prompt_text for g in groups],
                               metas=[g.meta for g in groups])
        exp.timings = timings
        exp.sampling_stats = stats
        batch.experience = exp

    def generate_and_score(self, prompts, pl_module, seed: int, timings: dict[str, float]) -> list[Group]:
        """One generation round: ``group_size`` responses per prompt of the ``PromptBatch``, scored
        by their tasks (and overlong-shaped); adds to ``timings``' ``rollout_s`` / ``scoring_s``."""
        t0 = time.perf_counter()
        completions = self.engine.generate(prompts.prompt_ids, self.group_size, self.sampling(pl_module, seed))
        timings["rollout_s"] += time.perf_counter() - t0
        return self.score(prompts, completions, pl_module, timings)

    def score(self, prompts, completions: list[list[Completion]], pl_module, timings: dict[str, float]
              ) -> list[Group]:
        """The groups of ``completions`` (one list per prompt of ``prompts``), scored by their tasks (and
        overlong-shaped); adds to ``timings``' ``scoring_s``."""
        t1 = time.perf_counter()
        flat = [c for cs in completions for c in cs]
        texts = [c.text for c in flat]
        gts = [gt for gt, cs in zip(prompts.ground_truths, completions) for _ in cs]
        metas = [m for m, cs in zip(prompts.metas, completions) for _ in cs]
        names = [t for t, cs in zip(prompts.tasks, completions) for _ in cs]
        results: list = [None] * len(texts)
        for name in sorted(set(names)):
            idx = [i for i, n in enumerate(names) if n == name]
            scored = self.task(name).score([texts[i] for i in idx], [gts[i] for i in idx], [metas[i] for i in idx])
            for i, res in zip(idx, scored):
                results[i] = res
        d, r = pl_module.cfg.algorithm.dapo, pl_module.cfg.rollout
        if d.overlong_buffer > 0:
            results = shape_overlong(results, [len(c.token_ids) for c in flat], r.max_new_tokens,
                                     d.overlong_buffer, d.overlong_penalty)
        timings["scoring_s"] += time.perf_counter() - t1
        groups, start = [], 0
        for i, cs in enumerate(completions):
            groups.append(Group(prompts.prompt_ids[i], prompts.prompt_texts[i], prompts.metas[i], list(cs),
                                results[start:start + len(cs)]))
            start += len(cs)
        return groups

    def dynamic_sampling(self, trainer, pl_module, batch, first: list[Group], timings: dict[str, float]
                         ) -> tuple[list[Group], dict[str, float]]:
        """Rounds, selection and redistribution (module docstring;
        :func:`arlopti.algorithms.dynamic_sampling.dynamic_sampling`): round ``k >= 1`` generates
        and scores the datamodule's ``extra_batch`` with its own seed. Returns this rank's groups to
        train on and its ``sampling_stats``. Collective when distributed."""
        rank, d = trainer.global_rank, pl_module.cfg.algorithm.dapo

        def next_round(k: int) -> list[Group]:
            extra = prompt_datamodule_of(trainer).extra_batch(batch.position, k)
            seed = round_seed(pl_module.cfg.rollout.seed, pl_module.rollout_step, rank, k)
            return self.generate_and_score(extra, pl_module, seed, timings)

        return dynamic_sampling(first, next_round, lambda g: [r.reward for r in g.results], rank=rank,
                                world=trainer.world_size, max_gen_batches=d.max_gen_batches)


def prompt_datamodule_of(trainer, why: str = "algorithm.dapo.dynamic_sampling=true draws extra prompts from it"):
    dm = getattr(trainer, "datamodule", None)
    if dm is None or not hasattr(dm, "extra_batch"):
        raise RuntimeError(f"the trainer's datamodule must be a PromptDataModule ({why}); fit with datamodule=...")
    return dm
