"""Applying one accumulated optimizer step: clip, step, the LR schedule, and the finiteness guard.

A mixin of :class:`~arlopti.learner.module.GRPOModule` (it reads the module's optimizer, guard, config
and collectives). Non-finite loss or gradient norm: the step is skipped (gradients dropped, no optimizer
or scheduler step), logged as ``update/nonfinite_skips``, and training continues; after
``algorithm.max_consecutive_skips`` skipped steps in a row it aborts. A step with a finite loss and
gradient that still leaves non-finite weights aborts at once, before any checkpoint can save them
(docs/learner.md).
"""

from __future__ import annotations

import math
import warnings

from arlopti.learner.guard import clip_global_norm, tensors_finite
from arlopti.learner.metric_set import MetricSet


class OptimizerStepMixin:
    """``_step_or_skip``, ``_step_schedule`` and ``_check_weights`` of the learner (module docstring)."""

    def _step_or_skip(self, loss: float, metrics: MetricSet, prefixes: list[str]) -> None:
        """Clip by the global norm and step, or skip a non-finite step (decided over all ranks)."""
        grad_norm = clip_global_norm(list(self.policy.parameters()), self.cfg.optim.grad_clip)
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if self.world > 1:  # one rank's NaN loss must skip the step everywhere, or the ranks diverge
            finite = self._all_reduce(0.0 if finite else 1.0) == 0
        if not self.guard.allow(finite, loss=loss, grad_norm=grad_norm, rollout_step=self.rollout_step):
            self.optimizers().zero_grad(set_to_none=True)
            return
        lr = float(self.optimizers().param_groups[0]["lr"])
        self.optimizers().step()
        self._check_weights(lr=lr, loss=loss, grad_norm=grad_norm)
        if self.cfg.optim.scheduler_interval == "optimizer_step":
            self._step_schedule()
        self.weight_version += 1
        for prefix in prefixes:
            metrics.add(f"{prefix}/grad_norm", grad_norm)
            metrics.add(f"{prefix}/steps", 1.0, "sum")

    def _step_schedule(self) -> None:
        """Advance the LR schedule. Under ``scheduler_interval=phase`` it counts phase passes (verl
        steps it once per ``update_actor`` call), and a pass whose steps were all skipped (an empty
        phase under ``empty_phase=skip``, or non-finite) took no optimizer step: when that is the
        run's first pass torch warns "lr_scheduler.step() before optimizer.step()". Advancing is
        intended there, so exactly that warning is silenced, here and nowhere else."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.lr_schedulers().step()

    def _check_weights(self, *, lr: float, loss: float, grad_norm: float) -> None:
        """After an optimizer step: are the updated parameters finite on every rank? (One fused
        reduction over this rank's parameters, :func:`~arlopti.learner.guard.tensors_finite`; one
        scalar all-reduce when distributed.) If not, abort before anything can checkpoint them."""
        finite = bool(tensors_finite(p for p in self.policy.parameters() if p.requires_grad))
        if self.world > 1:
            finite = self._all_reduce(0.0 if finite else 1.0, "max") == 0
        self.guard.check_weights(finite, rollout_step=self.rollout_step, lr=lr, loss=loss, grad_norm=grad_norm)
