"""``RolloutDumpCallback``: rollout dumps (:mod:`arlopti.learner.rollout_dump`) during training.

It writes, on the first rollout step and then every ``every_n_steps`` rollout steps
(``rollout_step % every_n_steps == 0``, the learner's TensorBoard x-axis), one file
``<dirpath>/rollouts_step<NNNNNN>.jsonl`` (``.jsonl.gz`` with ``gzip: true``) with one JSON object
per response (the record schema is in :mod:`arlopti.learner.rollout_dump`). It reads
``pl_module.last_step_context`` in ``on_train_batch_end``, so the step's training is already done;
it writes on global rank 0 only, and only rank 0's share of the batch (each rank holds whole
prompts; with ``world_size`` > 1 the file says so in every record).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L

from arlopti.callbacks.cadence import check_every
from arlopti.learner.rollout_dump import step_records, write_records


class RolloutDumpCallback(L.Callback):
    """Writes a rollout dump on the first step and every ``every_n_steps`` rollout steps (module doc)."""

    def __init__(self, dirpath: str, every_n_steps: int | None = 10, token_arrays: bool = True,
                 gzip: bool = False, max_rows: int | None = None, first_step: bool = True):
        self.dirpath = Path(dirpath)
        self.every_n_steps = check_every("callbacks.rollout_dump.every_n_steps", every_n_steps)
        self.token_arrays = token_arrays
        self.gzip = gzip
        self.max_rows = max_rows
        self.first_step = first_step
        self.written: list[Path] = []

    def due(self, step: int) -> bool:
        """Whether rollout step ``step`` (1-based, as the learner counts after the step) is written."""
        return (self.first_step and step == 1) or (self.every_n_steps is not None and step % self.every_n_steps == 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = getattr(pl_module, "last_step_context", None)
        step = int(getattr(pl_module, "rollout_step", 0))
        if ctx is None or not trainer.is_global_zero or not self.due(step):
            return
        records = step_records(ctx, step, rank=trainer.global_rank, world_size=trainer.world_size,
                               token_arrays=self.token_arrays, max_rows=self.max_rows)
        name = f"rollouts_step{step:06d}.jsonl" + (".gz" if self.gzip else "")
        self.written.append(write_records(self.dirpath / name, records))
