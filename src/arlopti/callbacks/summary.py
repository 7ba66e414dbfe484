"""``TrainingSummary``: prints what a run did, start against end, when fitting finishes.

It records the learner's per-step metrics (``GRPOModule.last_step_context``) and any
validation results the eval callback published (``pl_module.eval_results``), then prints:
rollout steps run; mean reward, accuracy and format rate at the first and the last step
(mean of the first/last ``window`` steps); validation accuracy per set at the first and last
evaluation; the fraction of failed reward calls (``reward_err``) when it is not zero; and, for
each logger the run actually used, where its files are and the command that opens them
(:func:`logger_hints`), printed as plain lines so that no path is ever wrapped. A run with steps
that carried no learning signal (:func:`arlopti.callbacks.progress.no_signal`: every group's
responses got the same reward, so every advantage was 0) says how many, and when it was every
step, that nothing was learned (:func:`no_signal_note`). The same numbers land in
``<output_dir>/summary.json`` (``no_signal_steps``) so a script (or a test) can read them.

Where the time went (``phase_seconds``, printed as one ``time:`` line): the start-up before fitting (from
the process's start: imports, config, model loading), the SFT cold start, the evaluations (their
``timing/eval_s``), the rollout (each step's ``timing/rollout_s`` + ``scoring_s`` + ``sync_s``) and the
update (``timing/logprobs_s`` + ``update_s``), the rest of the run as ``other`` and the ``total``, all wall
seconds of this process (a resumed run counts its own). Beside them, ``machine``: the CPU and its fp32 GEMM
rate measured at the end (:func:`arlopti.utils.machine.machine`), so a time can be read against the machine that took it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning.pytorch as L
from lightning.pytorch.utilities import rank_zero_only

from arlopti.callbacks.progress import advantage_estimator, no_signal
from arlopti.eval.runner import is_accuracy_key
from arlopti.utils.console import watch_fit_stop
from arlopti.utils.machine import machine


class TrainingSummary(L.Callback):
    KEYS = ("reward/mean", "reward/accuracy", "reward/format_ok", "rollout/response_len_mean",
            "rollout/truncated_frac")
    #: Shown only when not zero (a custom reward's failed calls).
    ERROR_KEYS = ("reward/error", "reward/timeout")
    #: A rollout step's phases, from the learner's ``timing/*`` metrics (docs/metrics.md).
    STEP_PHASES = {"rollout": ("timing/rollout_s", "timing/scoring_s", "timing/sync_s"),
                   "update": ("timing/logprobs_s", "timing/update_s")}

    def __init__(self, tensorboard_dir: str | None = None, window: int = 1, out_file: str | None = None):
        self.tensorboard_dir = tensorboard_dir
        self.window = max(1, window)
        self.out_file = out_file
        self.history: list[dict[str, float]] = []
        self.no_signal_steps = 0  # steps of this process without a learning signal
        self.step_phases = dict.fromkeys(self.STEP_PHASES, 0.0)
        self.start_up_s: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        watch_fit_stop(trainer)  # so Lightning's closing line names rollout_steps, not max_epochs
        self.start_up_s = process_age_s()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = getattr(pl_module, "last_step_context", None)
        if ctx is not None:
            self.history.append({k: float(ctx.metrics[k]) for k in self.KEYS + self.ERROR_KEYS
                                 if k in ctx.metrics})
            self.no_signal_steps += int(no_signal(ctx.metrics, advantage_estimator(pl_module)))
            for phase, keys in self.STEP_PHASES.items():
                self.step_phases[phase] += sum(float(ctx.metrics.get(k, 0.0)) for k in keys)

    def phase_seconds(self, pl_module, evals: list[dict]) -> dict[str, float | None]:
        """Wall seconds of each phase of this process (module docstring)."""
        total = process_age_s()
        phases = {"start_up": self.start_up_s, "cold_start": getattr(pl_module, "cold_start_seconds", 0.0),
                  "evaluations": sum(float(e.get("timing/eval_s", 0.0)) for e in evals), **self.step_phases}
        known = sum(v for v in phases.values() if v is not None)
        return {**phases, "other": None if total is None else max(0.0, total - known), "total": total}

    def summary(self, pl_module) -> dict:
        def mean(rows):
            keys = sorted({k for r in rows for k in r})
            return {k: sum(r[k] for r in rows if k in r) / max(1, sum(k in r for r in rows)) for k in keys}

        evals = getattr(pl_module, "eval_results", []) or []
        return {
            "rollout_steps": int(getattr(pl_module, "rollout_step", len(self.history))),
            "optimizer_steps": int(pl_module.trainer.global_step) if pl_module._trainer else None,
            "start": mean(self.history[: self.window]) if self.history else {},
            "end": mean(self.history[-self.window:]) if self.history else {},
            # a single evaluation is only the "last" one: it is not a start-vs-end comparison
            "eval_first": evals[0] if len(evals) > 1 else {},
            "eval_last": evals[-1] if evals else {},
            "no_signal_steps": self.no_signal_steps,  # of the len(history) steps this process ran
            "phase_seconds": self.phase_seconds(pl_module, evals),
            "machine": machine(),
            # null when the run had no TensorBoard logger (the folder was never written)
            "tensorboard_dir": self.tensorboard_dir if self.tensorboard_dir and Path(self.tensorboard_dir).is_dir()
            else None,
        }

    @rank_zero_only
    def on_fit_end(self, trainer, pl_module) -> None:
        s = self.summary(pl_module)
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"arlopti run summary: {s['rollout_steps']} rollout steps, "
                            f"{s['optimizer_steps']} optimizer steps")
        table.add_column("metric")
        span = "step" if self.window == 1 else f"{self.window} steps (mean)"
        table.add_column(f"first {span}", justify="right")
        table.add_column(f"last {span}", justify="right")
        for key in self.KEYS:
            if key in s["start"] or key in s["end"]:
                table.add_row(f"train {key}", _fmt(s["start"].get(key)), _fmt(s["end"].get(key)))
        errs = [sum(part.get(k, 0.0) for k in self.ERROR_KEYS) for part in (s["start"], s["end"])]
        if any(errs):
            table.add_row("train reward_err", _fmt(errs[0]), _fmt(errs[1]))
        first, last = s["eval_first"], s["eval_last"]
        if first or last:
            table.add_row("val at rollout step", _fmt_step(first.get("rollout_step")),
                          _fmt_step(last.get("rollout_step")))
        for key in sorted(set(first) | set(last)):
            if is_accuracy_key(key):
                table.add_row(key, _fmt(first.get(key)), _fmt(last.get(key)))
        console = Console()
        console.print(table)
        print(phase_line(s["phase_seconds"]) + f"; {s['machine']['cpu']}, fp32 GEMM "
              f"{s['machine']['gemm_fp32_gflops']:.0f} GFLOP/s", flush=True)
        note = no_signal_note(self.no_signal_steps, len(self.history))
        if note:
            print(note, flush=True)
        for line in logger_hints(trainer.loggers):
            print(line, flush=True)  # plain print: rich would wrap a long path at 80 columns without a TTY
        out = self.out_file or (Path(trainer.default_root_dir) / "summary.json")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(s, indent=2))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``'s start time against the boot
    clock), or None where that cannot be read."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def phase_line(phases: dict[str, float | None]) -> str:
    """``time: start-up 12 s, cold start 40 s, ... (total 408 s)``: the summary's line on where the time went."""
    names = {"start_up": "start-up", "cold_start": "cold start", "evaluations": "evaluations", "rollout": "rollout",
             "update": "update", "other": "other"}
    parts = [f"{label} {phases[k]:.0f} s" for k, label in names.items() if phases.get(k) is not None]
    total = phases.get("total")
    return "time: " + ", ".join(parts) + (f" (total {total:.0f} s)" if total is not None else "")


def no_signal_note(flat: int, steps: int) -> str | None:
    """The summary's line on steps without a learning signal (None when every step had one)."""
    if not flat:
        return None
    why = ("every group's responses got the same reward, so every advantage was 0 "
           "(reward/zero_std_group_frac = 1)")
    if flat == steps:
        return f"no learning signal at any of the {steps} rollout steps: {why}; nothing was learned from the reward"
    return f"no learning signal at {flat} of the {steps} rollout steps: {why} there"


def logger_hints(loggers) -> list[str]:
    """For each logger in use, where its files are and how to open them: TensorBoard's command,
    the csv ``metrics.csv``, the wandb run folder (offline: with ``wandb sync``; online: its URL),
    MLflow's ``mlflow ui --backend-store-uri`` for its store. Nothing for a logger that is not used."""
    from arlopti.learner.step_logging import logger_kind

    lines = []
    for logger in loggers or []:
        kind = logger_kind(logger)
        if kind == "tensorboard":
            lines.append(f"TensorBoard: tensorboard --logdir {logger.log_dir}  (its Custom Scalars tab, "
                         "#custom_scalars, puts reward, accuracy and validation first)")
        elif kind == "csv":
            lines.append(f"CSV: {Path(logger.log_dir) / 'metrics.csv'}")
        elif kind == "wandb":
            lines.append(_wandb_hint(logger))
        elif kind == "mlflow":
            uri = getattr(logger, "_tracking_uri", None) or ""
            lines.append(f"MLflow: mlflow ui --backend-store-uri {uri}" if uri else "MLflow: (default tracking URI)")
    return lines


def _wandb_hint(logger) -> str:
    run = getattr(logger, "_experiment", None)
    folder = Path(run.dir).parent if run is not None and getattr(run, "dir", None) else None
    if getattr(logger, "_offline", False):
        return (f"wandb (offline): {folder}\n  upload: wandb sync {folder}" if folder
                else "wandb (offline): upload with wandb sync <run dir>/wandb/offline-run-*")
    url = getattr(run, "url", None) if run is not None else None
    return f"wandb: {url or folder}"


def _fmt_step(v) -> str:
    return "-" if v is None else str(int(v))


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"
