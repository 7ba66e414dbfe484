"""The learner's one seam to the options: what a run's configuration asks of its step.

:class:`RunOptions` is built once per run from ``algorithm`` and ``rollout``. The learner's step asks
it what its forward passes must return (:mod:`.forward_needs`), whether the advantages read every
token's ``logπ_old`` before any backward, and, per micro-batch, for the
:class:`~arlopti.algorithms.objective.Shaping` that the core objective applies (:mod:`.shaping`),
the loss's denominator under the run's empty-row rule, and the effective-weight diagnostics.
"""

from __future__ import annotations

from torch import Tensor

from arlopti.algorithms.objective import Shaping
from arlopti.config import AlgorithmConfig, RolloutConfig, check_rollout_correction_logprobs
from arlopti.config.rules import effective_correction_mode
from arlopti.plugins.forward_needs import forward_stats, needs_old_before_update, old_pass_stats
from arlopti.plugins.mismatch import correction_weights
from arlopti.plugins.rival_losses import empty_rows, row_count
from arlopti.plugins.shaping import Forward, effective_weights, shaping_for


class RunOptions:
    """The options of one run (module docstring)."""

    def __init__(self, algorithm: AlgorithmConfig, rollout: RolloutConfig):
        self.algorithm, self.rollout = algorithm, rollout
        self.forward_stats = forward_stats(algorithm, rollout.temperature)  # the training forward's statistics
        self.old_pass_stats = old_pass_stats(algorithm)  # the old-log-prob pass's (OTB: Σ p²), or None
        self.needs_old_before_update = needs_old_before_update(algorithm)
        self.empty_rows = empty_rows(algorithm)  # how the seq-mean modes count an empty row

    def shaping(self, log_probs: Tensor, old: Tensor, advantages: Tensor, sub, phase_mask: Tensor,
                entropy: Tensor | None, dist) -> Shaping:
        """The shaping of micro-batch ``sub`` (an :class:`~arlopti.learner.experience.Experience`) for one phase."""
        forward = Forward(entropy, dist, sub.engine_logprobs, self.correction(old, sub))
        return shaping_for(self.algorithm, log_probs, old, advantages, sub.response_mask, phase_mask, forward)

    def correction(self, old: Tensor, sub) -> Tensor | None:
        """The rollout-mismatch weight of one micro-batch (``algorithm.rollout_correction``), or None."""
        rc = self.algorithm.rollout_correction
        mode = effective_correction_mode(self.rollout, rc)  # auto: tis under bounded staleness k > 0
        if mode == "none":
            return None
        check_rollout_correction_logprobs(mode, sub.engine_logprobs is not None)
        return correction_weights(old, sub.engine_logprobs, sub.response_mask, mode, cap=rc.cap,
                                  mis_low=rc.mis_low, mis_high=rc.mis_high)

    def loss_count(self, mask: Tensor, agg: str) -> float:
        """The loss's denominator over ``mask`` under the run's empty-row rule (:func:`~.rival_losses.row_count`)."""
        return row_count(mask, agg, self.empty_rows)

    @staticmethod
    def effective_weights(advantages: Tensor, shaping: Shaping, base_advantages: Tensor, old: Tensor,
                          phase_mask: Tensor) -> dict[str, float]:
        """:func:`~arlopti.plugins.shaping.effective_weights`."""
        return effective_weights(advantages, shaping, base_advantages, old, phase_mask)
