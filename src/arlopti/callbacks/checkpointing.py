"""Finding checkpoints of a run (``ckpt_path=last``)."""

from __future__ import annotations

from pathlib import Path


def find_last_checkpoint(cfg) -> Path | None:
    """The run's own ``checkpoints/last.ckpt``, else the newest one of an earlier run of the task."""
    try:
        own = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    except Exception:  # output_dir needs a Hydra runtime
        own = None
    if own is not None and own.exists():
        return own
    runs = Path(cfg.paths.log_dir) / str(cfg.task_name) / "runs"
    found = sorted(runs.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
