"""The learner's run around its step: set-up, collectives, checkpoints, and the end of each step.

A mixin of :class:`~arlopti.learner.module.GRPOModule`, which keeps the step itself; this is what Lightning
calls around it. The reference model is rebuilt from the config, never saved; a checkpoint holds the
counters, the guard and every rank's RNG state (:mod:`~arlopti.learner.checkpoint_state`).
"""

from __future__ import annotations

from dataclasses import asdict

import torch
from torch import Tensor

from arlopti.config import validate_once
from arlopti.learner.checkpoint_state import drop_reference_weights, learner_state, load_learner_state
from arlopti.algorithms.inputs import StepInputs
from arlopti.learner.experience import Experience
from arlopti.learner.metric_set import MetricSet
from arlopti.learner.optim import build_optimizer
from arlopti.learner.sharding import shard_under_model_parallel
from arlopti.learner.step_context import StepContext
from arlopti.learner.step_logging import write_hparams, write_step
from arlopti.tasks.base import trainer_placement
from arlopti.utils.precision import mixed_compute_dtype, spread_master_weights
from arlopti.utils.rng import restore_rng_state


class RunLifecycleMixin:
    """Lightning's hooks around the learner's step (module docstring)."""

    @property
    def world(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    @property
    def _lora_base(self) -> dict | None:
        """A LoRA run's base-model identity (its checkpoints hold only the adapter), else None."""
        return self.policy.hf.arlopti_base_identity if self.lora else None

    def setup(self, stage: str) -> None:
        validate_once(self.cfg, world_size=self.world)  # skipped when already validated for this world size
        placement = trainer_placement(self.trainer) if stage == "fit" and self._trainer is not None else None
        if placement is not None and self.cfg.model.spread_master_weights:  # the casts see small updates (issue 49)
            spread_master_weights(self.policy, mixed_compute_dtype(placement[1]))

    def configure_model(self) -> None:
        """FSDP2 under a ``ModelParallelStrategy``: shard the policy and the reference. Idempotent."""
        if self._trainer is not None:
            shard_under_model_parallel(self, self.trainer.strategy, self.cfg.model.decoder_layer_class)

    def configure_optimizers(self):
        opt, sched = build_optimizer([p for p in self.policy.parameters() if p.requires_grad], self.cfg.optim)
        return [opt], [{"scheduler": sched, "interval": "step"}]

    def _all_reduce(self, value: float, op: str = "sum") -> float:
        """Reduce a scalar over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return float(value)
        t = torch.tensor(float(value), device=self.device, dtype=torch.float64)
        return float(self.trainer.strategy.reduce(t, reduce_op=op))

    def _sum_over_ranks(self, t: Tensor) -> Tensor:
        """Sum a tensor over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return t
        return self.trainer.strategy.reduce(t.to(self.device), reduce_op="sum")

    # ------------------------------------------------------------------ the end of a step
    def _finish_step(self, batch, experience: Experience, t: StepInputs, metrics: MetricSet) -> None:
        """Reduce and log the metrics, keep the step's context, mark the batch consumed, stop at the end."""
        values = metrics.as_dict() if self.world == 1 else metrics.reduce_over_ranks(
            lambda x, op: self.trainer.strategy.reduce(x, reduce_op=op), self.world, self.device)
        self.last_step_context = StepContext(experience, t.old, t.base_advantages, t.advantages,
                                             list(t.phases.values()), values)
        self.log("reward", values["reward/mean"], prog_bar=True, logger=False, rank_zero_only=True)
        if self._trainer is None:
            return
        if self.trainer.global_rank == 0:
            write_step(self.loggers, values, experience, self.rollout_step, self.log_completions)
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "mark_consumed"):
            dm.mark_consumed(batch)
        if self.total_rollout_steps is not None and self.rollout_step >= self.total_rollout_steps:
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Counters and every rank's RNG states (collective when distributed: all ranks save)."""
        checkpoint["arlopti"] = learner_state(self.rollout_step, self.weight_version, self.guard.state_dict(),
                                              self.world, self._lora_base)
        drop_reference_weights(self, checkpoint.get("state_dict", {}), "", None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Counters, guard and RNG state. The RNG state is applied in on_train_start, after Lightning
        has built the dataloader iterator (which draws from torch's generator), so the first resumed
        step starts from the saved state exactly."""
        rank = self.trainer.global_rank if self._trainer else 0
        self.rollout_step, version, self._pending_rng = load_learner_state(checkpoint, self.policy, self.guard, rank,
                                                                           self.world, self._lora_base)
        self.weight_version = version + 1  # force an engine sync

    def on_before_optimizer_step(self, optimizer) -> None:
        """Before this process's first optimizer step: warn when it would move the weights by more than
        their own norm (:meth:`~arlopti.learner.guard.NonFiniteGuard.check_first_step`)."""
        self.guard.check_first_step(optimizer, self.rollout_step)

    def on_train_start(self) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None

    def on_train_end(self) -> None:
        """The run's config with its final metrics, for TensorBoard's HPARAMS tab (rank 0)."""
        if self.trainer.global_rank == 0 and self.last_step_context is not None:
            write_hparams(self.loggers, asdict(self.cfg), self.last_step_context.metrics,
                          self.trainer.callback_metrics, self.rollout_step)
