"""``logger=csv``: Lightning's ``CSVLogger`` writing **one row per rollout step** to ``metrics.csv``.

The learner's scalars, the validation results and the diagnostics of a step arrive in separate
``log_metrics`` calls with the same ``step`` (the rollout step); Lightning's logger writes a row per
call, so a step took three rows, each with most columns empty. :class:`StepCSVLogger` merges the
calls of one step into one row and writes it when the next step's first call arrives (or when the
run ends: ``finalize`` saves), so a row is complete when it is written. A call without ``step``
keeps Lightning's behaviour.
"""

from __future__ import annotations

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only


class StepCSVLogger(CSVLogger):
    """See the module docstring; the arguments are ``CSVLogger``'s."""

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        if step is None:
            return super().log_metrics(metrics, step)
        writer = self.experiment
        values = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}" if self._prefix else k:
                  (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        if writer.metrics and writer.metrics[-1].get("step") == step:
            writer.metrics[-1].update(values)
            return
        if writer.metrics:  # a new step: the previous one is complete
            self.save()
        writer.log_metrics(values, step)
