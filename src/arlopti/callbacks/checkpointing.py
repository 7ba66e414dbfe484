"""Checkpoints on rollout steps, on preemption signals and by a validation metric; finding them.

:class:`RolloutCheckpoint` (``callbacks.model_checkpoint``) writes, under ``dirpath``:

* ``last.ckpt`` every ``every_n_steps`` rollout steps (Lightning's ``global_step`` counts
  optimizer steps, which Lopti doubles, so it is not used), at the end of training, and when
  the process receives one of ``signals`` (``SIGTERM``, ``SIGUSR1``: preemption; ``SIGINT``:
  Ctrl-C). A signal only sets a flag; the step in progress finishes, then every rank saves and
  training stops cleanly (exit status 0), logging how to resume and leaving ``PREEMPTED`` (a
  JSON note: step, signal) beside the checkpoint for a job script to requeue on; a run that ends
  normally removes it. A second signal kills the process at once (a second Ctrl-C too). Also when
  the learner stops on a :class:`~arlopti.learner.guard.NonFiniteAbort` whose weights are still those
  of the step's start (finite): the abort's one line names the file (:meth:`RolloutCheckpoint.on_exception`).

The checkpoint folder is checked to be writable at start-up (:meth:`RolloutCheckpoint.check_writable`,
called by ``arlopti.entry.train.build`` and again in ``setup``), not at the first save after the training
work. A resumed checkpoint's weights are checked to be finite as it is loaded, before any callback
or step uses them; the error names the first bad tensor (:meth:`RolloutCheckpoint.on_load_checkpoint`).
* ``step=NNNNNN-<monitor>=<value>.ckpt``: the ``save_top_k`` best checkpoints by ``monitor``
  (a key of ``trainer.callback_metrics`` such as ``val/kk/mean/greedy/acc``, published by the
  eval callback), checked whenever that metric has a new value. ``monitor: null``: none.

Each save goes to ``<name>.tmp`` first, is verified (:func:`arlopti.checkpoints.resume.validate_checkpoint`:
every zip entry against its CRC-32; a distributed folder gets its sha256 manifest first) and only
then renamed into place by rank 0, the previous ``last.ckpt`` kept as ``last.ckpt.old`` (the
fallback of ``ckpt_path=last`` when ``last.ckpt`` is damaged); a ``kill -9`` during a save
therefore never leaves a half-written ``last.ckpt``, and a save that fails verification replaces
nothing. Before anything is written the live state (weights, buffers, optimizer state) is checked
to be finite on every rank: a non-finite checkpoint is never written (:class:`CheckpointError`).
Under FSDP2 a checkpoint is a distributed-checkpoint folder (one shard per rank) rather than a
file; the names are the same.

What a checkpoint holds: the policy weights (not the reference model, which is rebuilt from
the config), optimizer and LR-scheduler state, Lightning's loop counters, the DataModule's
position (``PromptDataModule.state_dict``), the learner's counters (``rollout_step``, which
with ``rollout.seed`` and the rank determines every rollout seed, ``weight_version``, skip
counts), every rank's Python/NumPy/torch RNG states, and this callback's top-k bookkeeping.

Which checkpoint a run resumes from, whether it is complete, and what its run state says (its
non-tensor part, its run config against this run's) is :mod:`arlopti.checkpoints.resume`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Iterable

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Checkpoint

from arlopti.callbacks.cadence import check_every, due
from arlopti.learner.guard import NonFiniteAbort, tensors_finite
from arlopti.checkpoints.resume import LAST, CheckpointError, validate_checkpoint, write_manifest

log = logging.getLogger(__name__)

PREEMPTED = "PREEMPTED"  # written beside last.ckpt when a signal stopped the run


# ---------------------------------------------------------------------------------------------
# the callback
# ---------------------------------------------------------------------------------------------


class RolloutCheckpoint(Checkpoint):
    """See the module docstring."""

    def __init__(self, dirpath: str, every_n_steps: int | None = 10, save_last: bool = True,
                 monitor: str | None = None, mode: str = "max", save_top_k: int = 1,
                 signals: Iterable[str] = ("SIGTERM", "SIGUSR1", "SIGINT"), save_on_train_end: bool = True):
        if mode not in ("max", "min"):
            raise ValueError(f"callbacks.model_checkpoint.mode={mode!r}: use 'max' or 'min'")
        check_every("callbacks.model_checkpoint.every_n_steps", every_n_steps)
        if save_top_k < 0:
            raise ValueError(f"callbacks.model_checkpoint.save_top_k={save_top_k} must be >= 0")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.save_last = save_last
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.signals = [_signal_number(s) for s in signals]
        self.save_on_train_end = save_on_train_end
        self.best: list[tuple[float, str]] = []  # (score, path), best first
        self.last_saved_step = -1
        self.preempted = False
        self._received: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._seen_metric: torch.Tensor | None = None

    # ---- state (restored with the checkpoint) --------------------------------------------------
    def state_dict(self) -> dict:
        return {"best": [list(b) for b in self.best], "monitor": self.monitor, "last_saved_step": self.last_saved_step}

    def load_state_dict(self, state: dict) -> None:
        if state.get("monitor") == self.monitor:
            self.best = [(float(s), str(p)) for s, p in state.get("best", [])]
        self.last_saved_step = int(state.get("last_saved_step", -1))

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Refuse a checkpoint with NaN/inf weights before anything uses them, naming the first bad
        tensor (a single file: its ``state_dict``; a distributed folder: the weights just loaded)."""
        from arlopti.checkpoints.resume import first_nonfinite

        state = checkpoint.get("state_dict")
        found = first_nonfinite(state.items() if state else pl_module.state_dict().items())
        bad_somewhere = found is not None
        if trainer.world_size > 1:  # each rank holds its own shards: every rank stops, none waits in a collective
            flag = torch.tensor(float(bad_somewhere), device=trainer.strategy.root_device)
            bad_somewhere = float(trainer.strategy.reduce(flag, reduce_op="max")) > 0
        if bad_somewhere:
            what = (f"first bad tensor {found[0]!r} ({found[1]} of {found[2]} values NaN/inf)" if found is not None
                    else "another rank's shard holds NaN/inf (its error names the tensor)")
            raise CheckpointError(f"the checkpoint being resumed holds non-finite weights: {what}; the run diverged "
                                  "or the file is corrupt. Resume from an earlier checkpoint (e.g. last.ckpt.old or a "
                                  "top-k file).")

    # ---- start-up -----------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Create ``dirpath`` and write and remove a probe file there; an error naming the folder
        (``callbacks.model_checkpoint.dirpath``) if that fails."""
        probe = self.dirpath / f".write-test-{os.getpid()}"
        try:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise CheckpointError(f"callbacks.model_checkpoint.dirpath={self.dirpath} is not a writable folder "
                                  f"({type(err).__name__}: {err.strerror or err}); checkpoints could not be saved. "
                                  "Point it (or paths.output_dir) at a writable place.") from None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self.check_writable()

    # ---- signals ------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        if self._received is not None:  # second signal: stop waiting for the step to finish
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._received = signum
        log.warning("received %s: checkpointing after the current rollout step, then stopping",
                    signal.Signals(signum).name)

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning installs its own SIGTERM handler (which would abort the fit) before this hook;
        # ours replaces it for the length of training so that the save and exit are clean.
        if threading.current_thread() is not threading.main_thread():
            return
        for s in self.signals:
            self._previous_handlers[s] = signal.getsignal(s)
            signal.signal(s, self._on_signal)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s, h in self._previous_handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous_handlers.clear()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore_handlers()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A :class:`~arlopti.learner.guard.NonFiniteAbort` that left the weights as they were at the start
        of the rollout step (its ``clean``): save them to ``last.ckpt`` now, as a failed rollout worker's
        stop does, and name the file in the abort's one line (issue 42). One process only: under several
        ranks the line names the last checkpoint saved instead."""
        if not isinstance(exception, NonFiniteAbort) or not exception.clean or not self.save_last:
            return
        step = int(pl_module.rollout_step)
        if trainer.world_size > 1:
            last = f"{self.dirpath / LAST} (rollout step {self.last_saved_step})" if self.last_saved_step >= 0 else None
            exception.checkpoint_note = f"The last checkpoint: {last or 'none yet'}."
            return
        try:
            path = self.save_last_checkpoint(trainer, step, reason="non-finite abort")
        except CheckpointError as err:
            exception.checkpoint_note = f"No checkpoint saved: {err}."
        else:
            exception.checkpoint_note = f"The last finite weights (after rollout step {step}) are saved in {path}."

    def signal_received(self, trainer) -> bool:
        """Whether any rank got a preemption signal (collective when distributed)."""
        flag = 1.0 if self._received is not None else 0.0
        if trainer.world_size > 1:
            t = torch.tensor(flag, device=trainer.strategy.root_device)
            flag = float(trainer.strategy.reduce(t, reduce_op="max"))
        return flag > 0

    # ---- when to save -------------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = int(pl_module.rollout_step)
        if self.signal_received(trainer):
            self.save_last_checkpoint(trainer, step, reason="preemption signal")
            self.preempted = True
            pl_module.preempted = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                name = signal.Signals(self._received).name if self._received is not None else "another rank's signal"
                (self.dirpath / PREEMPTED).write_text(json.dumps({"rollout_step": step, "signal": name}) + "\n")
                log.warning("stopped by %s after rollout step %d. Resume with the same command plus "
                            "ckpt_path=%s (or ckpt_path=last)", name, step, self.dirpath / LAST)
            return
        self._maybe_top_k(trainer, step)  # first, so that last.ckpt records the updated ranking
        # The final save happens here, on the last batch, not in on_train_end: by then Lightning's
        # loop state says the epoch is over, and a resume would skip the rest of it.
        if self.save_last and due(self.every_n_steps, step):
            self.save_last_checkpoint(trainer, step, reason=f"every {self.every_n_steps} rollout steps")
        elif self.save_last and self.save_on_train_end and _fit_ends_after_this_batch(trainer):
            self.save_last_checkpoint(trainer, step, reason="end of training")

    def on_train_end(self, trainer, pl_module) -> None:
        step = int(pl_module.rollout_step)
        if not self.preempted:
            self._maybe_top_k(trainer, step)  # the eval callback's at_end results
        if self.save_last and self.save_on_train_end and step != self.last_saved_step:
            # a stop this callback could not foresee (e.g. max_steps); the epoch counts as finished
            self.save_last_checkpoint(trainer, step, reason="end of training")
        if not self.preempted and trainer.is_global_zero:
            _remove(self.dirpath / PREEMPTED)
        self._restore_handlers()

    # ---- saving -------------------------------------------------------------------------------
    def save_last_checkpoint(self, trainer, step: int, reason: str = "") -> Path:
        path = self.dirpath / LAST
        self.last_saved_step = step  # before the save, so the checkpoint records itself
        save_atomic(trainer, path)
        if trainer.is_global_zero:
            log.info("saved checkpoint %s at rollout step %d (%s)", path, step, reason)
        return path

    def _maybe_top_k(self, trainer, step: int) -> None:
        if not self.monitor or self.save_top_k == 0:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or value is self._seen_metric:
            return
        self._seen_metric = value
        score = float(value)
        if not math.isfinite(score):
            return
        worse = (lambda a, b: a < b) if self.mode == "max" else (lambda a, b: a > b)
        if len(self.best) >= self.save_top_k and not worse(self.best[-1][0], score):
            return
        name = f"step={step:06d}-{_safe(self.monitor)}={score:.4f}.ckpt"
        path = self.dirpath / name
        self.best.append((score, str(path)))
        self.best.sort(key=lambda b: b[0], reverse=self.mode == "max")
        dropped = self.best[self.save_top_k:]
        self.best = self.best[:self.save_top_k]
        save_atomic(trainer, path)
        if trainer.is_global_zero:
            log.info("saved top-%d checkpoint %s (%s=%.4f)", self.save_top_k, path, self.monitor, score)
            for _, p in dropped:
                if Path(p) != path:
                    _remove(Path(p))


def _fit_ends_after_this_batch(trainer) -> bool:
    """Whether ``fit`` stops after the current batch (called in ``on_train_batch_end``)."""
    if trainer.should_stop:  # rollout_steps reached, or another callback stopped the run
        return True
    if 0 < trainer.max_steps <= trainer.global_step:
        return True
    last_batch = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
    max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else math.inf
    return last_batch and trainer.current_epoch + 1 >= max_epochs


def save_atomic(trainer: L.Trainer, path: Path) -> None:
    """``trainer.save_checkpoint`` to ``path`` via ``path.tmp``; collective (call on every rank).

    Refuses (:class:`CheckpointError`, nothing written) when the state to save is not finite on
    some rank (:func:`check_state_finite`). Rank 0 verifies the finished save (a folder gets its
    sha256 manifest first) and only then renames it into place, the previous ``path`` kept as
    ``path.old``; so at every instant one complete checkpoint exists, and a bad save never
    replaces a good one. Needs a filesystem shared by all ranks when distributed.
    """
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    check_state_finite(trainer, path)
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
    trainer.strategy.barrier("arlopti_ckpt_prepare")
    # weights_only=False: the full state (optimizer, loops, callbacks), said explicitly so that
    # Lightning does not log its 'weights_only was not set' line at every save. Ends with a barrier.
    trainer.save_checkpoint(tmp, weights_only=False)
    error = None
    if trainer.is_global_zero:
        try:
            if tmp.is_dir():
                write_manifest(tmp)
            validate_checkpoint(tmp)
        except CheckpointError as err:
            error = f"the save to {tmp} failed its verification, {path} is left as it was: {err}"
            _remove(tmp)
        else:
            _remove(old)
            if path.exists():
                path.rename(old)
            tmp.rename(path)
    if trainer.world_size > 1:
        error = trainer.strategy.broadcast(error, src=0)
    trainer.strategy.barrier("arlopti_ckpt_done")
    if error is not None:
        raise CheckpointError(error)


def check_state_finite(trainer: L.Trainer, path: Path | str = "the checkpoint") -> None:
    """Raise :class:`CheckpointError` (on every rank: collective) when the module's parameters or
    buffers or the optimizer state hold a non-finite value on some rank, or the learner's guard
    has seen poisoned weights. One fused reduction per dtype over this rank's shards."""
    module = trainer.lightning_module
    tensors = [t for k, t in [*module.named_parameters(), *module.named_buffers()] if not k.startswith("ref.")]
    tensors += [v for opt in trainer.optimizers for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor)]
    ok = bool(tensors_finite(tensors)) and not getattr(getattr(module, "guard", None), "poisoned", False)
    if trainer.world_size > 1:
        flag = torch.tensor(0.0 if ok else 1.0, device=trainer.strategy.root_device)
        ok = float(trainer.strategy.reduce(flag, reduce_op="max")) == 0
    if not ok:
        bad = _first_non_finite(module, trainer.optimizers)
        raise CheckpointError(f"refusing to save {path}: the state holds non-finite values"
                              f"{f' ({bad} on rank {trainer.global_rank})' if bad else ' (on another rank)'}; "
                              "the last saved checkpoint is left as it was")


def _first_non_finite(module, optimizers) -> str | None:
    """The name of the first non-finite tensor of this rank's state (slow; only after a failed check)."""
    for k, t in [*module.named_parameters(), *module.named_buffers()]:
        if not k.startswith("ref.") and not bool(tensors_finite([t])):
            return k
    for i, opt in enumerate(optimizers):
        for j, st in enumerate(opt.state.values()):
            for name, v in st.items():
                if isinstance(v, torch.Tensor) and not bool(tensors_finite([v])):
                    return f"optimizer {i} state {j} {name}"
    if getattr(getattr(module, "guard", None), "poisoned", False):
        return "an optimizer step made the weights non-finite"
    return None


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _signal_number(s) -> int:
    if isinstance(s, int):
        return s
    try:
        return int(getattr(signal.Signals, str(s).upper()))
    except AttributeError:
        raise ValueError(f"callbacks.model_checkpoint.signals: unknown signal {s!r} (use e.g. SIGTERM, SIGUSR1)")


__all__ = ["RolloutCheckpoint", "check_state_finite", "save_atomic"]
