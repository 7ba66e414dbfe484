"""``TrainingSummary``: prints what a run did, start against end, when fitting finishes.

It records the learner's per-step metrics (``GRPOModule.last_step_context``) and any
validation results the eval callback published (``pl_module.eval_results``), then prints:
rollout steps run; mean reward, accuracy and format rate at the first and the last step
(mean of the first/last ``window`` steps); validation accuracy per set at the first and last
evaluation; and where the TensorBoard logs are. The same numbers land in
``<output_dir>/summary.json`` so a script (or a test) can read them.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as L
from lightning.pytorch.utilities import rank_zero_only


class TrainingSummary(L.Callback):
    KEYS = ("reward/mean", "reward/accuracy", "reward/format_ok", "rollout/response_len_mean",
            "rollout/truncated_frac")

    def __init__(self, tensorboard_dir: str | None = None, window: int = 1, out_file: str | None = None):
        self.tensorboard_dir = tensorboard_dir
        self.window = max(1, window)
        self.out_file = out_file
        self.history: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = getattr(pl_module, "last_step_context", None)
        if ctx is not None:
            self.history.append({k: ctx.metrics[k] for k in self.KEYS if k in ctx.metrics})

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
            "tensorboard_dir": self.tensorboard_dir,
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
        first, last = s["eval_first"], s["eval_last"]
        if first or last:
            table.add_row("val at rollout step", _fmt_step(first.get("rollout_step")),
                          _fmt_step(last.get("rollout_step")))
        for key in sorted(set(first) | set(last)):
            if key.endswith("acc") or "avg@" in key or "pass@" in key or key.endswith("accuracy"):
                table.add_row(key, _fmt(first.get(key)), _fmt(last.get(key)))
        console = Console()
        console.print(table)
        if self.tensorboard_dir:
            console.print(f"TensorBoard logs: {self.tensorboard_dir}\n  tensorboard --logdir {self.tensorboard_dir}")
        out = self.out_file or (Path(trainer.default_root_dir) / "summary.json")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(s, indent=2))


def _fmt_step(v) -> str:
    return "-" if v is None else str(int(v))


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"
