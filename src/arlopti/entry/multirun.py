"""A multirun folder that summarises itself: ``<sweep dir>/multirun_summary.{json,md}``.

``python train.py -m ...`` (a grid, ``hparams_search=...``, any launcher) puts job ``n`` in
``<sweep dir>/<n>/``. :class:`MultirunSummary`, a Hydra callback (``configs/hydra/default.yaml``),
does two things:

* at the end of every job, in the job's own process (so under submitit too), it writes the job's
  ``job_status.json`` (completed or failed, the one-line error, the objective the job returned), then
  rebuilds the summary from every job folder, under a file lock: a job that fails, or a sweep that
  stops half-way, leaves a summary of every job that ended;
* at the end of the multirun it rebuilds the summary once more and prints its table.

The summary (:func:`summarise`) reads only the job folders: their overrides (``.hydra/overrides.yaml``),
``job_status.json`` and the run's own ``summary.json`` (``arlopti.callbacks.summary``). Per job: the
swept values (the overrides whose values differ between jobs), the status, the objective
(``optimized_metric``), and the final metrics: the last step's training metrics (``end``) and the last
validation (``eval_last``). Jobs that differ only in ``seed`` form a group; a group with two or more
completed seeds gets each metric's mean and 95% CI over its seeds, the project's percentile bootstrap
(:func:`arlopti.eval.compare.bootstrap_diffs` on the per-seed values: 10,000 resamples, seed 0; with
few seeds it is coarse, and the number of seeds is given beside it). A job without ``job_status.json``
(killed, or still running) is listed as ``no result``; one that Ctrl-C stopped, ending the sweep,
as ``interrupted`` (``arlopti.entry.cluster.stop_sweep_if_interrupted``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)

STATUS_FILE = "job_status.json"
SUMMARY_JSON = "multirun_summary.json"
SUMMARY_MD = "multirun_summary.md"
SEED_KEY = "seed"


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job folders of a sweep (those holding ``.hydra/overrides.yaml``), in job order."""
    found = [p.parent.parent for p in Path(sweep_dir).glob("*/.hydra/overrides.yaml")]
    return sorted(found, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def read_overrides(job_dir: Path) -> dict[str, str]:
    """``{key: value}`` of a job's task overrides, as Hydra saved them."""
    from omegaconf import OmegaConf

    items = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))
    return dict(str(o).split("=", 1) if "=" in str(o) else (str(o), "") for o in items)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def final_metrics(run_summary: dict | None) -> dict[str, float]:
    """A run's final numbers from its ``summary.json``: ``rollout_steps``, the last step's training
    metrics (``end``) and the last validation (``eval_last``, its ``rollout_step`` left out)."""
    if not run_summary:
        return {}
    out: dict[str, float] = {"rollout_steps": float(run_summary.get("rollout_steps") or 0)}
    for part in ("end", "eval_last"):
        for k, v in (run_summary.get(part) or {}).items():
            if k != "rollout_step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
    return out


def job_row(job_dir: Path) -> dict:
    """One job of the summary (module docstring)."""
    status = _read_json(job_dir / STATUS_FILE) or {}
    return {"job": job_dir.name, "dir": str(job_dir), "overrides": read_overrides(job_dir),
            "status": status.get("status", "no result"), "error": status.get("error"),
            "objective": status.get("objective"), "metrics": final_metrics(_read_json(job_dir / "summary.json"))}


def swept_keys(rows: list[dict]) -> list[str]:
    """The override keys whose value is not the same in every job (missing counts as a value)."""
    keys = sorted({k for r in rows for k in r["overrides"]})
    return [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]


def seed_ci(values: list[float]) -> dict:
    """Mean and 95% percentile-bootstrap CI of ``values`` (one per seed), the project's bootstrap."""
    import numpy as np

    from arlopti.eval.compare import RESAMPLES, SEED, bootstrap_diffs

    _, boot = bootstrap_diffs([np.asarray(values, dtype=float)], RESAMPLES, SEED)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": float(np.mean(values)), "ci95": [float(lo), float(hi)], "seeds": len(values)}


def seed_groups(rows: list[dict], swept: list[str]) -> list[dict]:
    """Jobs with the same swept values but the seed; for each group of >= 2 completed seeds, every
    metric's (and the objective's) mean and CI over the seeds."""
    if SEED_KEY not in swept:
        return []
    others = [k for k in swept if k != SEED_KEY]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "completed":
            groups.setdefault(tuple(r["overrides"].get(k) for k in others), []).append(r)
    out = []
    for values, members in groups.items():
        if len(members) < 2:
            continue
        stats = {}
        names = sorted({k for m in members for k in m["metrics"]}) + ["objective"]
        for name in names:
            got = [m["objective"] if name == "objective" else m["metrics"].get(name) for m in members]
            got = [float(v) for v in got if isinstance(v, (int, float)) and math.isfinite(float(v))]
            if len(got) == len(members):
                stats[name] = seed_ci(got)
        out.append({"values": dict(zip(others, values)), "seeds": [m["overrides"].get(SEED_KEY) for m in members],
                    "jobs": [m["job"] for m in members], "metrics": stats})
    return out


def summarise(sweep_dir: str | Path) -> dict:
    """The summary of a sweep folder (module docstring)."""
    rows = [job_row(d) for d in job_dirs(Path(sweep_dir))]
    swept = swept_keys(rows)
    for r in rows:
        r["swept"] = {k: r["overrides"].get(k) for k in swept}
    counts = {s: sum(r["status"] == s for r in rows) for s in ("completed", "failed", "interrupted", "no result")}
    return {"sweep_dir": str(sweep_dir), "jobs": rows, "swept_keys": swept, "counts": counts,
            "seed_groups": seed_groups(rows, swept)}


#: The metrics the table shows (every metric is in the JSON file).
TABLE_METRICS = ("reward/mean", "reward/accuracy")


def table_columns(summary: dict) -> list[str]:
    """The metric columns of the table: the objective, the training reward and accuracy, and every
    validation accuracy that some job has."""
    from arlopti.eval.runner import is_accuracy_key

    have = {k for r in summary["jobs"] for k in r["metrics"]}
    vals = sorted(k for k in have if k.startswith("val/") and is_accuracy_key(k) and "/mean/" in k)
    return [k for k in TABLE_METRICS if k in have] + vals


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, (int, float)) else str(v)


def _fmt_value(v: str | None) -> str:
    """A swept value as the table shows it: a float sampled by a sweeper to 4 significant digits."""
    try:
        return v if v is None or "." not in v and "e" not in v.lower() else f"{float(v):.4g}"
    except ValueError:
        return str(v)


def markdown(summary: dict) -> str:
    """The summary as Markdown: the jobs table, then the seed groups (mean [95% CI])."""
    cols = table_columns(summary)
    head = ["job", "status", *summary["swept_keys"], "objective", *cols]
    lines = [f"# Multirun {summary['sweep_dir']}", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in summary["jobs"]:
        status = r["status"] + (f": {r['error']}" if r.get("error") else "")
        swept = [_fmt_value(r["swept"][k]) for k in summary["swept_keys"]]
        cells = [r["job"], status.replace("|", "/").replace("\n", " "), *swept, _fmt(r["objective"]),
                 *(_fmt(r["metrics"].get(c)) for c in cols)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for g in summary["seed_groups"]:
        lines += ["", f"Seeds {', '.join(map(str, g['seeds']))} at " +
                  (", ".join(f"{k}={v}" for k, v in g["values"].items()) or "the same settings") +
                  " (mean [95% bootstrap CI over seeds]):", ""]
        for name, s in g["metrics"].items():
            lines.append(f"- {name}: {s['mean']:.4g} [{s['ci95'][0]:.4g}, {s['ci95'][1]:.4g}] (n = {s['seeds']})")
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: str | Path) -> dict:
    """Rebuild and write ``multirun_summary.json`` and ``.md`` under a lock (jobs end concurrently)."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".multirun_summary.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = summarise(sweep_dir)
        files = ((SUMMARY_JSON, json.dumps(summary, indent=2, default=str)), (SUMMARY_MD, markdown(summary)))
        for name, text in files:
            tmp = sweep_dir / f".{name}.tmp"
            tmp.write_text(text)
            tmp.replace(sweep_dir / name)
    return summary


def job_status(job_return) -> dict:
    """What ``job_status.json`` records of a finished job (Hydra's ``JobReturn``)."""
    from hydra.core.utils import JobStatus

    from arlopti.entry.failures import JobFailed

    # the failure itself: JobReturn.return_value would re-raise it (and print Hydra's report line)
    value = getattr(job_return, "_return_value", None)
    if job_return.status == JobStatus.COMPLETED:
        objective = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        return {"status": "completed", "objective": objective, "overrides": list(job_return.overrides or [])}
    error = value.line if isinstance(value, JobFailed) else f"{type(value).__name__}: {value}"
    return {"status": "failed", "error": error.splitlines()[0] if error else None,
            "overrides": list(job_return.overrides or [])}


class MultirunSummary(Callback):
    """The Hydra callback of the module docstring (``hydra.callbacks.multirun_summary``)."""

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN or not _is_rank_zero():
            return
        out = Path(config.hydra.runtime.output_dir)
        (out / STATUS_FILE).write_text(json.dumps({"job": config.hydra.job.num, **job_status(job_return)}, indent=2))
        write_summary(config.hydra.sweep.dir)

    def on_multirun_end(self, config, **kwargs) -> None:
        summary = write_summary(config.hydra.sweep.dir)
        print_summary(summary)


def _is_rank_zero() -> bool:
    """Only one task of a multi-task (one task per GPU) job records it."""
    import os

    return all(os.environ.get(v, "0") == "0" for v in ("SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID", "LOCAL_RANK"))


def print_summary(summary: dict) -> None:
    """The jobs table on the console, and where the files are."""
    from rich.console import Console
    from rich.table import Table

    cols = table_columns(summary)
    n = summary["counts"]
    table = Table(title=f"multirun: {n['completed']} completed, {n['failed']} failed"
                        + (f", {n['interrupted']} interrupted" if n["interrupted"] else "")
                        + (f", {n['no result']} without a result" if n["no result"] else ""))
    for c in ["job", "status", *summary["swept_keys"], "objective", *cols]:
        table.add_column(c, overflow="fold")
    for r in summary["jobs"]:
        table.add_row(r["job"], r["status"], *(str(_fmt_value(r["swept"][k])) for k in summary["swept_keys"]),
                      _fmt(r["objective"]), *(_fmt(r["metrics"].get(c)) for c in cols))
    Console(width=160).print(table)
    print(f"multirun summary: {Path(summary['sweep_dir']) / SUMMARY_MD} (every metric: {SUMMARY_JSON})", flush=True)


__all__ = ["MultirunSummary", "STATUS_FILE", "SUMMARY_JSON", "SUMMARY_MD", "final_metrics", "job_dirs",
           "job_status", "markdown", "print_summary", "seed_ci", "seed_groups", "summarise", "swept_keys",
           "write_summary"]
