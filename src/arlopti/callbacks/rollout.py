"""``RolloutCallback``: the actor side of the loop. It collects, scores and makes the experience.

Every step, written once for every placement, in ``on_train_batch_start``: (1) it frees the previous
update's gradients (``zero_grad(set_to_none=True)``: the learner zeroes them before every mini-batch
anyway, and on 7B over 4 GPUs they are 7.6 GB per GPU that vLLM can use); (2) **collect**: the rollout
source (:mod:`arlopti.rollout.source`, built in ``setup`` by :func:`arlopti.rollout.factory.build_rollouts`:
colocated HF, colocated vLLM, or the rollout workers of ``placement=server``) returns
``sizes.group_size`` episodes per prompt of this rank's share of the batch, synced to the learner's
``weight_version`` (or, on the workers, within ``rollout.async.max_staleness``); (3) **score**: the task
rewards each episode's final answer (``Episode.text``), plus the environment's reward of a multi-turn
episode (``task.env``: :func:`arlopti.rollout.turns.with_env_rewards`, the component ``env_reward``;
the turn loop itself runs inside the source, :mod:`arlopti.rollout.turns`), plus DAPO's overlong
shaping when ``algorithm.dapo.overlong_buffer > 0``:
:func:`arlopti.plugins.dapo.overlong_penalty`, with ``L_max = rollout.max_new_tokens`` and lengths in
the episode's sampled tokens, logged as the reward component ``overlong_penalty``); (4) with
``algorithm.dapo.dynamic_sampling`` keeps only the groups that carry signal, collecting more prompts
until enough do (below); (5) **experience**: attaches an :class:`~arlopti.learner.experience.Experience`
to the batch as ``batch.experience``, with each row's policy version where the source recorded one.
The learner never calls the source or a reward: the split is deliberate, so either side can be
swapped (HF ↔ vLLM ↔ workers, K&K ↔ math) without touching the other.

Seeds: :mod:`arlopti.rollout.seeds` (the step's round seed from ``rollout.seed``, the rollout step, the
rank and the round; one seed per response from it), applied by the source's
:class:`~arlopti.rollout.source.SamplingPlan`.

Dynamic sampling (DAPO §3.2; :mod:`arlopti.plugins.dapo`, run by
:mod:`arlopti.plugins.dynamic_sampling`), exact under data parallelism:

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
  as ``dapo/no_signal_fallback`` (:func:`arlopti.plugins.dapo.select_groups` says why).

Logged every step (``Experience.sampling_stats`` → ``dapo/*``, docs/metrics.md): the generation
rounds, the groups generated, the kept fraction (groups with signal / groups generated) and the
groups trained on. ``batch``'s own prompt lists still describe the main batch; the experience
holds the groups trained on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import lightning.pytorch as L
import torch

from arlopti.plugins.dapo import overlong_penalty
from arlopti.plugins.dynamic_sampling import dynamic_sampling
from arlopti.callbacks.progress import planned_steps
from arlopti.config import check_rollout_offload
from arlopti.learner.experience import build_experience
from arlopti.rollout.episode import Episode
from arlopti.rollout.factory import build_rollouts
from arlopti.rollout.server_rollouts import RolloutWorkersLost
from arlopti.rollout.source import Collected, RolloutSource
from arlopti.rollout.turns import build_turn_loop, with_env_rewards
from arlopti.tasks.env.base import EnvError
from arlopti.tasks.base import RewardResult, Task, get_task, trainer_placement, with_prompt

log = logging.getLogger(__name__)


@dataclass
class Group:
    """One prompt and its scored episodes (what dynamic sampling keeps, drops or moves)."""

    prompt_ids: list[int]
    prompt_text: str
    meta: dict
    episodes: list[Episode]
    results: list[RewardResult]


def shape_overlong(results: list[RewardResult], lengths: list[int], max_len: int, buffer: int,
                   factor: float) -> list[RewardResult]:
    """The results with DAPO's overlong penalty added to each reward and recorded as the component
    ``overlong_penalty`` (:func:`arlopti.plugins.dapo.overlong_penalty`)."""
    pen = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor).tolist()
    return [replace(r, reward=r.reward + p, components={**r.components, "overlong_penalty": p})
            for r, p in zip(results, pen)]


def save_before_stopping(trainer, pl_module, why: str = "the rollout workers failed",
                         until: str = "the workers run again") -> str:
    """Save ``last.ckpt`` now, as a preemption signal would (the steps done so far are not lost), and say where
    and how to resume (``why``: the reason logged; ``until``: what must hold first); under several ranks (a
    collective save the other ranks are not in) name the last checkpoint instead."""
    ckpt = next((c for c in trainer.callbacks if hasattr(c, "save_last_checkpoint")), None)
    if ckpt is None:
        return "No checkpoint callback: the steps of this run are not saved."
    step = int(pl_module.rollout_step)
    if trainer.world_size > 1:
        last = getattr(ckpt, "last_saved_step", None)
        where = f"{ckpt.dirpath / 'last.ckpt'} (rollout step {last})" if last is not None else "none yet"
        return f"With {trainer.world_size} ranks no checkpoint is written now; the last one: {where}."
    path = ckpt.save_last_checkpoint(trainer, step, reason=why)
    return (f"The {step} rollout step(s) done are saved in {path}: resume with the same command plus "
            f"ckpt_path=last once {until}.")


def saved_stop(trainer, pl_module, err: Exception) -> Exception:
    """``err`` (the rollout workers lost, or ``task.env`` broke its contract or its error rule) as the one line
    that stops the run, once the steps done are saved (:func:`save_before_stopping`; issue 42): raised by the
    rollout step, DAPO's extra rounds and validation alike. One line: a command line shows a failure as one."""
    if isinstance(err, RolloutWorkersLost):  # the worker's log tail, if any, is in its log file
        note = save_before_stopping(trainer, pl_module)
    elif pl_module.rollout_step > 0:
        note = save_before_stopping(trainer, pl_module, "the environment failed", "the environment is fixed")
    else:
        note = "No rollout step was done: no checkpoint is written."
    return type(err)(" ".join(f"{err} {note}".split()))


def resume_note(rollout_cfg, step: int) -> str | None:
    """What a run resumed at rollout step ``step`` must be told about its samples, or None: under
    ``placement=server`` with ``max_staleness = k >= 1`` the batches in flight at the stop are not in
    the checkpoint, so the resumed run generates them again with newer weights and is not bit-identical
    to an uninterrupted one (docs/scaling.md, the server placement's **Resume**). Said once, at the start."""
    k = rollout_cfg.async_.max_staleness
    if rollout_cfg.placement != "server" or k <= 0 or step <= 0:
        return None
    return (f"resumed at rollout step {step} with rollout.async.max_staleness={k}: the batches that were in "
            "flight are not in the checkpoint and are generated again by the resumed weights, so the next "
            "steps' samples are fresher than in an uninterrupted run and the run is not bit-identical to one "
            "(with max_staleness=0 it is; docs/scaling.md)")


def prompt_datamodule_of(trainer, why: str):
    """The trainer's :class:`~arlopti.data.prompt_datamodule.PromptDataModule` (``why`` says what needs it)."""
    dm = getattr(trainer, "datamodule", None)
    if dm is None or not hasattr(dm, "extra_batch"):
        raise RuntimeError(f"the trainer's datamodule must be a PromptDataModule ({why}); fit with datamodule=...")
    return dm


class RolloutCallback(L.Callback):
    def __init__(self, group_size: int, task_kwargs: dict | None = None, env=None):
        self.group_size = group_size
        self.task_kwargs = dict(task_kwargs or {})
        self.env = env  # the run's task.* environment settings (arlopti.config.schema.EnvConfig), or None
        self.source: RolloutSource | None = None
        self._tasks: dict[str, Task] = {}
        self.placement = None  # (device, precision) for a task's own model (Task.place), set in setup

    @property
    def engine(self):
        """The in-process engine (shared with the eval callbacks), or None under ``placement=server``."""
        return None if self.source is None else self.source.engine

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.placement = trainer_placement(trainer)
        r = pl_module.cfg.rollout
        if r.placement != "server":
            offload = getattr(getattr(getattr(trainer, "strategy", None), "fsdp_options", None), "cpu_offload", False)
            check_rollout_offload(r.backend, bool(offload))
        elif stage != "fit":
            return
        if self.source is None:
            if r.placement == "server":
                log.info("rollout.placement=server: the rollout workers generate with vLLM; rollout.backend=%s is "
                         "the engine of this process's evals", r.backend)
            self.source = build_rollouts(pl_module.cfg.model, r, pl_module.policy, pl_module.tokenizer,
                                         self.group_size, precision=trainer.precision,
                                         device=trainer.strategy.root_device, run_dir=trainer.default_root_dir,
                                         rank=trainer.global_rank, world=trainer.world_size,
                                         engine=getattr(pl_module, "rollout_engine", None))
            if self.source.engine is not None:
                pl_module.rollout_engine = self.source.engine
            # HF under data parallelism: every rank makes every turn's generate call (FSDP2 gathers in it)
            lockstep = r.placement != "server" and r.backend == "hf" and trainer.world_size > 1
            self.source.turns = build_turn_loop(r, self.env, pl_module.tokenizer, lockstep=lockstep)
            # validation's episodes (callbacks.benchmark_eval): a loop of their own, on this process's engine
            pl_module.rollout_turns = build_turn_loop(r, self.env, pl_module.tokenizer,
                                                      lockstep=r.backend == "hf" and trainer.world_size > 1)

    def on_train_start(self, trainer, pl_module) -> None:
        note = resume_note(pl_module.cfg.rollout, int(pl_module.rollout_step))
        if note:
            log.warning(note)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()
        for loop in (getattr(self.source, "turns", None), getattr(pl_module, "rollout_turns", None)):
            if loop is not None:
                loop.close()  # the environment's worker processes (a later round starts them again)
        self._close_workers()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close_workers()  # no rollout worker outlives a failed run

    def _close_workers(self) -> None:
        if self.source is not None and self.source.engine is None:
            self.source.close()
            self.source = None

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = get_task(name, **(self.task_kwargs.get(name) or {}))
            if self.placement is not None:
                self._tasks[name].place(*self.placement)
        return self._tasks[name]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        for opt in getattr(trainer, "optimizers", ()):  # gradients are not needed until the update: free them
            opt.zero_grad(set_to_none=True)
        ahead = self.ahead(trainer, pl_module, batch) if pl_module.cfg.rollout.placement == "server" else None
        timings = {"rollout_s": 0.0, "scoring_s": 0.0, "sync_s": 0.0}
        stats: dict[str, float] = {}
        try:  # DAPO's extra rounds generate too: a failure there keeps the steps done as the first round's does
            got = self.collect(pl_module, batch, timings, ahead=ahead)
            groups = self.score(batch, got.groups, pl_module, timings)
            if pl_module.cfg.algorithm.dapo.dynamic_sampling:
                groups, stats = self.dynamic_sampling(trainer, pl_module, batch, groups, timings)
        except (RolloutWorkersLost, EnvError) as err:
            raise saved_stop(trainer, pl_module, err) from err
        t1 = time.perf_counter()
        self.source.release()
        timings["rollout_s"] += time.perf_counter() - t1
        exp = build_experience([g.prompt_ids for g in groups], [g.episodes for g in groups],
                               [r for g in groups for r in g.results], pad_id=pl_module.tokenizer.pad_token_id,
                               group_offset=trainer.global_rank * len(groups),
                               prompt_texts=[g.prompt_text for g in groups], metas=[g.meta for g in groups])
        exp.timings = timings
        exp.sampling_stats = stats
        if got.stats:
            exp.async_stats = {**got.stats, "trainer_wait_s": got.timings["rollout_s"], "sync_s": got.timings["sync_s"]}
        batch.experience = exp

    @staticmethod
    def ahead(trainer, pl_module, batch):
        """``ahead(j)``: the batch ``j`` rollout steps after ``batch``, or None past the run's last step
        (what the rollout workers generate ahead; nothing is generated for steps the run never takes)."""
        dm = prompt_datamodule_of(trainer, "rollout.placement=server generates the next steps' prompts ahead")
        last = planned_steps(getattr(pl_module, "total_rollout_steps", None), trainer.max_epochs,
                             trainer.num_training_batches) - 1

        def batch_ahead(j: int):
            return dm.batch_ahead(batch.position, j) if pl_module.rollout_step + j <= last else None

        return batch_ahead

    def collect(self, pl_module, prompts, timings: dict[str, float], round_index: int = 0, ahead=None) -> Collected:
        """One round of the source's episodes of ``prompts``; adds to ``timings``' ``rollout_s`` / ``sync_s``."""
        got = self.source.collect(pl_module.policy, pl_module.weight_version, pl_module.rollout_step, prompts,
                                  round_index=round_index, ahead=ahead)
        for k, v in got.timings.items():
            timings[k] = timings.get(k, 0.0) + v
        return got

    def score(self, prompts, episodes: list[list[Episode]], pl_module, timings: dict[str, float]) -> list[Group]:
        """The groups of ``episodes`` (one list per prompt of ``prompts``), scored by their tasks (and
        overlong-shaped); adds to ``timings``' ``scoring_s``."""
        t1 = time.perf_counter()
        flat = [e for es in episodes for e in es]
        texts = [e.text for e in flat]
        gts = [gt for gt, es in zip(prompts.ground_truths, episodes) for _ in es]
        messages = prompts.messages or [None] * len(prompts.metas)  # the prompt in meta: a reward model reads it
        metas = [with_prompt(m, ms, t) for m, ms, t, es in zip(prompts.metas, messages, prompts.prompt_texts, episodes)
                 for _ in es]
        names = [t for t, es in zip(prompts.tasks, episodes) for _ in es]
        results: list = [None] * len(texts)
        for name in sorted(set(names)):
            idx = [i for i, n in enumerate(names) if n == name]
            scored = self.task(name).score([texts[i] for i in idx], [gts[i] for i in idx], [metas[i] for i in idx])
            for i, res in zip(idx, scored):
                results[i] = res
        results = with_env_rewards(results, flat)
        d, r = pl_module.cfg.algorithm.dapo, pl_module.cfg.rollout
        if d.overlong_buffer > 0:
            results = shape_overlong(results, [e.sampled_tokens for e in flat], r.max_new_tokens,
                                     d.overlong_buffer, d.overlong_penalty)
        timings["scoring_s"] += time.perf_counter() - t1
        groups, start = [], 0
        for i, es in enumerate(episodes):
            ids = es[0].prompt_ids if es and es[0].prompt_ids is not None else prompts.prompt_ids[i]  # env's prompt
            text = es[0].meta.get("prompt_text", prompts.prompt_texts[i]) if es else prompts.prompt_texts[i]
            groups.append(Group(ids, text, prompts.metas[i], list(es), results[start:start + len(es)]))
            start += len(es)
        return groups

    def dynamic_sampling(self, trainer, pl_module, batch, first: list[Group], timings: dict[str, float]
                         ) -> tuple[list[Group], dict[str, float]]:
        """Rounds, selection and redistribution (module docstring;
        :func:`arlopti.plugins.dynamic_sampling.dynamic_sampling`): round ``k >= 1`` collects and
        scores the datamodule's ``extra_batch`` with its own seed. Returns this rank's groups to train
        on and its ``sampling_stats``. Collective when distributed."""
        dm = prompt_datamodule_of(trainer, "algorithm.dapo.dynamic_sampling=true draws extra prompts from it")

        def next_round(k: int) -> list[Group]:
            extra = dm.extra_batch(batch.position, k)
            return self.score(extra, self.collect(pl_module, extra, timings, round_index=k).groups, pl_module,
                              timings)

        return dynamic_sampling(first, next_round, lambda g: [r.reward for r in g.results],
                                rank=trainer.global_rank, world=trainer.world_size,
                                max_gen_batches=pl_module.cfg.algorithm.dapo.max_gen_batches)
