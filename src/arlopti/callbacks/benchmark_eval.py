"""``BenchmarkEvalCallback``: validation on rollout steps, through the rollout engine.

It evaluates the DataModule's ``val_sets`` (K&K per-N test sets, math benchmarks; each set's
task comes from its samples) before training, every ``every_n_steps`` rollout steps, and at
the end, with the modes of each task: by default the official ones, K&K greedy plus one sample
at T = 1, math 16 samples at T = 1 (avg@16, pass@16). See :mod:`arlopti.eval.runner` for the
metric names. Results go to the loggers at ``step = rollout_step``, into
``trainer.callback_metrics`` (so a checkpoint callback can monitor e.g.
``val/kk/mean/greedy/acc``), and onto ``pl_module.eval_results`` for the run summary.
``val/<task>/mean/sets`` says how many sets each mean is over (their names are logged); an empty
validation set, or a name in ``sets`` that the DataModule lacks, is an error.
"""

from __future__ import annotations

import logging

import lightning.pytorch as L
import torch

from arlopti.callbacks.cadence import check_every, due
from arlopti.callbacks.rollout import saved_stop
from arlopti.eval.runner import KK_MODES, MATH_MODES, EvalMode, evaluate_sets
from arlopti.tasks.base import Task, get_task, trainer_placement
from arlopti.tasks.env.base import EnvError

log = logging.getLogger(__name__)


def parse_modes(modes: dict | None) -> dict[str, tuple[EvalMode, ...]]:
    out = {"kk": KK_MODES, "math": MATH_MODES}
    for task, rows in (modes or {}).items():
        out[task] = tuple(EvalMode(**dict(r)) for r in rows)
    return out


class BenchmarkEvalCallback(L.Callback):
    def __init__(self, every_n_steps: int | None = 20, before_training: bool = True, at_end: bool = True,
                 limit: int | None = None, max_new_tokens: int = 256, modes: dict | None = None,
                 sets: list[str] | None = None, seed: int = 1234, log_samples: int = 2,
                 task_kwargs: dict | None = None):
        self.every_n_steps = check_every("callbacks.benchmark_eval.every_n_steps", every_n_steps)
        self.before_training = before_training
        self.at_end = at_end
        self.limit = limit
        self.max_new_tokens = max_new_tokens
        self.modes = parse_modes(modes)
        self.sets = sets
        self.seed = seed
        self.log_samples = log_samples
        self.task_kwargs = dict(task_kwargs or {})  # the run's `tasks` node: reward options per task
        self._tasks: dict[str, Task] = {}
        self._last_step = -1
        self._placement = None  # (device, precision) for a task's own model (Task.place)

    def _task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = get_task(name, **(self.task_kwargs.get(name) or {}))
            if self._placement is not None:
                self._tasks[name].place(*self._placement)
        return self._tasks[name]

    def _engine(self, trainer, pl_module):
        engine = getattr(pl_module, "rollout_engine", None)
        if engine is None:  # no colocated rollout source (placement=server): an engine of rollout.backend
            from arlopti.rollout.factory import autocast_of, build_engine

            engine = build_engine(pl_module.cfg.rollout, pl_module.policy, pl_module.tokenizer,
                                  autocast_dtype=autocast_of(trainer.precision, trainer.strategy.root_device),
                                  device=trainer.strategy.root_device)
            pl_module.rollout_engine = engine
        return engine

    def run(self, trainer, pl_module) -> dict[str, float]:
        step = int(pl_module.rollout_step)
        self._placement = trainer_placement(trainer)
        if step == self._last_step:
            return {}
        self._last_step = step
        dm = trainer.datamodule
        sets = dict(getattr(dm, "val_sets", {}) or {})
        if self.sets is not None:
            missing = [k for k in self.sets if k not in sets]
            if missing:  # a configured set never drops out of val/<task>/mean silently
                raise ValueError(f"callbacks.benchmark_eval.sets names {missing}, which the data module does not "
                                 f"provide (its validation sets: {sorted(sets)})")
            sets = {k: v for k, v in sets.items() if k in self.sets}
        if not sets:
            return {}
        engine = self._engine(trainer, pl_module)
        engine.wake()
        engine.sync_weights(pl_module.policy, pl_module.weight_version)
        world = trainer.world_size
        reduce_sum = None
        if world > 1:
            def reduce_sum(t: torch.Tensor) -> torch.Tensor:
                return trainer.strategy.reduce(t.to(pl_module.device), reduce_op="sum")
        try:
            metrics, results = evaluate_sets(engine, sets, self.modes, self._task, self.max_new_tokens,
                                             seed=self.seed, limit=self.limit, rank=trainer.global_rank, world=world,
                                             reduce_sum=reduce_sum, keep_samples=self.log_samples,
                                             turns=getattr(pl_module, "rollout_turns", None))  # task.env: episodes
        except EnvError as err:  # the environment stops the run in validation too: keep the steps done first
            raise saved_stop(trainer, pl_module, err) from err
        engine.sleep()
        for k, v in metrics.items():
            trainer.callback_metrics[k] = torch.tensor(v)
        history = getattr(pl_module, "eval_results", None)
        if history is None:
            history = pl_module.eval_results = []
        history.append({"rollout_step": step, **metrics})
        if trainer.global_rank == 0:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
                writer = getattr(logger, "experiment", None)
                if writer is not None and hasattr(writer, "add_text"):
                    for res in results:
                        for i, smp in enumerate(res.samples):
                            writer.add_text(f"val_samples/{res.name}/{res.mode}/{i}",
                                            f"correct={smp['correct']}\n\n    " + smp["response"].replace("\n", "\n    "),
                                            step)
            log.info("eval at rollout step %d: %s", step,
                     {k: round(v, 4) for k, v in metrics.items() if "/mean/" in k})
        return metrics

    def on_train_start(self, trainer, pl_module) -> None:
        if self.before_training and pl_module.rollout_step == 0:
            self.run(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if due(self.every_n_steps, pl_module.rollout_step):
            self.run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        # after a preemption signal, leave the grace period to the checkpoint, not to evaluation
        if self.at_end and not getattr(pl_module, "preempted", False):
            self.run(trainer, pl_module)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for t in self._tasks.values():
            t.close()
        self._tasks.clear()
