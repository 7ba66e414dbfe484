"""A run launched as a submitit job (``hydra/launcher=slurm``, ``submitit_slurm``, ``submitit_local``).

Hydra's submitit launcher runs each job's task function in a submitit job: on SLURM one task per
GPU (``configs/hydra/launcher/slurm.yaml``), every task a trainer rank (Lightning reads the SLURM
environment). Two things a training run must do there, done here from ``arlopti.entry.train.train``:

* **The job's shape** (:func:`prepare_job`): ``trainer.num_nodes`` is the job's node count. A config
  that leaves it at 1 takes the job's; one that names another number is refused, naming both keys.
* **Preemption and time limits** (:func:`hand_back_if_preempted`): submitit signals the job
  (``SIGUSR2``, ``$SUBMITIT_PREEMPT_SIGNAL``) ``signal_delay_s`` before the end, and its own handler
  would requeue at once, mid-step. The checkpoint callback is given that signal too
  (``callbacks.model_checkpoint.signals``), so it finishes the step and saves ``last.ckpt`` first;
  once the fit has stopped, the signal is raised again for submitit's handler (restored by then),
  which requeues the job with the same overrides. The requeued job finds its folder's
  ``last.ckpt`` with ``ckpt_path=auto`` (pass it: docs/scaling.md) and goes on.

Outside a submitit job (``$SUBMITIT_EXECUTOR`` unset) nothing here does anything.
"""

from __future__ import annotations

import logging
import os
import signal

from omegaconf import DictConfig, open_dict

from arlopti.config import ConfigError

log = logging.getLogger(__name__)


def submitit_executor() -> str | None:
    """``slurm`` or ``local`` inside a submitit job, else None."""
    return os.environ.get("SUBMITIT_EXECUTOR") or None


def preemption_signal() -> str:
    """The signal submitit sends before a time limit or on preemption (its ``USR_SIG``)."""
    return "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")


def job_nodes() -> int:
    """The job's node count (SLURM's, or submitit-local's)."""
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SUBMITIT_LOCAL_JOB_NUM_NODES"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def prepare_job(cfg: DictConfig) -> None:
    """Under submitit: ``trainer.num_nodes`` from the job, and the checkpoint callback listening for
    submitit's signal (module docstring). A no-op elsewhere."""
    if submitit_executor() is None:
        return
    nodes = job_nodes()
    asked = int(cfg.trainer.get("num_nodes", 1))
    if asked not in (1, nodes):
        raise ConfigError(f"trainer.num_nodes={asked} in a job of {nodes} node(s): the job's nodes are the trainer's "
                          f"(hydra.launcher.nodes); set hydra.launcher.nodes={asked}, or leave trainer.num_nodes at 1")
    with open_dict(cfg):
        if asked != nodes:
            log.info("trainer.num_nodes=%d: the submitit job's node count", nodes)
            cfg.trainer.num_nodes = nodes
        ckpt = (cfg.get("callbacks") or {}).get("model_checkpoint")
        sig = preemption_signal()
        if ckpt is not None and sig not in list(ckpt.get("signals") or []):
            ckpt.signals = [*list(ckpt.get("signals") or []), sig]


def check_multirun_ranks(trainer) -> None:
    """A ``--multirun`` job on this machine cannot start ranks itself: Lightning would re-run the
    sweep's own command line in each rank. Several ranks per job need a launcher that starts them
    (``hydra/launcher=slurm``: one task per GPU)."""
    from arlopti.entry.failures import in_multirun

    launched_here = not any(v in os.environ for v in ("LOCAL_RANK", "SLURM_PROCID", "SUBMITIT_EXECUTOR"))
    ranks = int(trainer.num_devices) * int(trainer.num_nodes)
    if ranks > 1 and launched_here and in_multirun():
        raise ConfigError(f"trainer.devices x trainer.num_nodes = {ranks} ranks in a --multirun job: Lightning would "
                          "start them by re-running the whole sweep; run each job on one device (trainer.devices=1), "
                          "or launch the sweep's jobs with hydra/launcher=slurm (one task per GPU)")


def stop_sweep_if_interrupted(module) -> None:
    """A job of a sweep run in this process (the basic launcher) that a signal stopped (Ctrl-C,
    SIGTERM; checkpoint saved) ends the sweep too, instead of going on to the next job: exit 1
    naming the signal and the checkpoint. Submitit jobs are requeued instead (:func:`hand_back_if_preempted`)."""
    import sys

    from arlopti.entry.failures import in_multirun

    sig = stopped_by(module)
    if sig is None or submitit_executor() is not None or not in_multirun():
        return
    ckpt = next((f"{cb.dirpath}/last.ckpt" for cb in module.trainer.callbacks if hasattr(cb, "save_last_checkpoint")),
                "its checkpoints/last.ckpt")
    record_interrupted(sig, ckpt)
    sys.exit(f"{sig}: the sweep stops here; this job saved {ckpt} (resume it with its overrides plus ckpt_path=<it>), "
             "the jobs after it did not run")


def record_interrupted(sig: str, ckpt: str) -> None:
    """This job's ``job_status.json`` (interrupted, by which signal, its checkpoint) and the sweep's
    summary rewritten: the job exits before Hydra's end-of-job callback would record it."""
    import json
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from arlopti.entry.multirun import STATUS_FILE, write_summary

    hc = HydraConfig.get()
    status = {"job": hc.job.num, "status": "interrupted", "error": f"stopped by {sig}; checkpoint {ckpt}",
              "overrides": list(hc.overrides.task)}
    (Path(hc.runtime.output_dir) / STATUS_FILE).write_text(json.dumps(status, indent=2))
    write_summary(hc.sweep.dir)


def stopped_by(module) -> str | None:
    """The signal that stopped the fit early (the checkpoint callback's ``PREEMPTED`` note: SIGTERM,
    SIGINT, ...), or None when the fit ended by itself."""
    if module is None or not getattr(module, "preempted", False):
        return None
    import json
    from pathlib import Path

    from arlopti.callbacks.checkpointing import PREEMPTED, RolloutCheckpoint

    for cb in module.trainer.callbacks:
        note = Path(cb.dirpath) / PREEMPTED if isinstance(cb, RolloutCheckpoint) else None
        if note is not None and note.is_file():
            return str(json.loads(note.read_text()).get("signal"))
    return "a signal"


def hand_back_if_preempted(module) -> None:
    """After a fit that submitit's signal (or SLURM's SIGTERM) stopped, checkpoint saved, give
    submitit's own handler its signal, so that it requeues the job (and exits). A no-op outside
    submitit, after a normal end, or after another signal (SIGINT: a cancel)."""
    if submitit_executor() is None or stopped_by(module) not in (preemption_signal(), "SIGTERM"):
        return
    sig = getattr(signal, preemption_signal())
    log.warning("preempted: checkpoint saved; handing %s to submitit to requeue the job (it resumes with "
                "ckpt_path=auto)", signal.Signals(sig).name)
    signal.raise_signal(sig)


__all__ = ["check_multirun_ranks", "hand_back_if_preempted", "job_nodes", "preemption_signal", "prepare_job",
           "stop_sweep_if_interrupted", "stopped_by", "submitit_executor"]
