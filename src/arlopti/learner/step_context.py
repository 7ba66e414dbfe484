"""What one training step computed, kept on the learner for the callbacks that run after it.

The diagnostics, rollout-dump, progress and summary callbacks read ``GRPOModule.last_step_context``
in ``on_train_batch_end`` instead of recomputing the step's log-probs, advantages and phases.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from arlopti.algorithms import Phase
from arlopti.learner.experience import Experience


@dataclass
class StepContext:
    """What one training step computed, for diagnostics callbacks (read in on_train_batch_end)."""

    experience: Experience
    old_log_probs: Tensor  # [B, R]
    advantages_raw: Tensor  # [B, R] before AR
    advantages: Tensor  # [B, R] after AR
    phases: list[Phase]
    metrics: dict[str, float]


__all__ = ["StepContext"]
