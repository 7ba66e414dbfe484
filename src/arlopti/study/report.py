"""The toy study's folder: ``study.json`` (every number), ``summary.json`` (the same without the
per-run rewards, floats at 4 significant digits: the copy docs/figures/study/ keeps), ``tables.md``
and the three figures.

Reads each run's ``steps.jsonl`` and each seed's ``mechanism/seed<s>.json`` back from the folder, so the
report can be rebuilt from the files alone (tests/study/test_toy.py checks it against the runs'
``csv/metrics.csv``, the learner's own log).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from arlopti.study.figures import plot_curves, plot_mechanism, plot_paired, save
from arlopti.study.toy_run import read_rows
from arlopti.study.tables import (in_training_markdown, learning_markdown, mechanism_markdown,
                                           mechanism_table, method_table, run_summary)


#: The methods every other one is paired against (when they are in the study).
BASELINES = ("grpo", "ar_lopti")


def code_version() -> dict:
    """The checkout's commit and the source files modified beside it (the code the runs ran), or {}."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit, "modified_or_new_src_files": [line[3:] for line in dirty]}


def recorded_seconds(out: Path, methods: list[str], seeds: list[int]) -> dict:
    """The wall time each run and each seed's mechanism recorded when it ran (this call may have reused them)."""
    runs = [json.loads((out / "runs" / m / f"seed{s}" / "run.json").read_text()).get("seconds")
            for m in methods for s in seeds]
    mech = [json.loads(f.read_text()).get("seconds") for f in sorted((out / "mechanism").glob("seed*.json"))]
    return {"runs_with_a_time": sum(x is not None for x in runs), "runs_s": sum(x for x in runs if x is not None),
            "mechanism_with_a_time": sum(x is not None for x in mech), "mechanism_s": sum(x for x in mech if x)}


def _rounded(x):
    """``x`` with every float at 4 significant digits."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _caption(sizes, seeds: list[int], args) -> str:
    warm = f"warm start {sizes.warm_start_steps} SFT steps" if sizes.warm_start_steps else "no warm start"
    return (f"tiny model, first-half task, {warm}; {len(seeds)} seeds; {sizes.steps} rollout steps of "
            f"{sizes.prompts_per_step} prompts x {sizes.group_size}, {sizes.max_new_tokens} tokens at T={sizes.temperature:g}, "
            f"AdamW lr {sizes.lr:g}, two mini-batches per step; threshold {args.threshold:g}")


def write_toy_report(out: Path, methods: list[str], seeds: list[int], sizes, args, timings: dict) -> dict:
    runs = {m: {s: run_summary(read_rows(out / "runs" / m / f"seed{s}"), args.threshold, args.final_window)
                for s in seeds} for m in methods}
    learning = method_table(runs, seeds, BASELINES)
    mech_files = [out / "mechanism" / f"seed{s}.json" for s in seeds]
    per_seed = [json.loads(f.read_text()) for f in mech_files if f.exists()]
    mechanism = mechanism_table(per_seed) if len(per_seed) == len(seeds) else None
    caption = _caption(sizes, seeds, args)
    files = {"curves": save(plot_curves(learning, caption), out / "curves.png"),
             "paired": save(plot_paired(learning, caption=caption), out / "paired.png"),
             "mechanism": save(plot_mechanism(learning, mechanism, caption), out / "mechanism.png")}
    command = getattr(args, "command_line", None)
    study = {"setting": "toy", "command": command, "caption": caption, "methods": methods, "seeds": seeds,
             "sizes": asdict(sizes), "threshold": args.threshold, "final_window": args.final_window,
             "learning": learning, "mechanism": mechanism,
             "per_run": {m: {str(s): {k: v for k, v in r.items() if k != "in_training"} for s, r in by.items()}
                         for m, by in runs.items()},
             "timings_s": {**timings, "run_s_total": sum(timings["run_s"]), "workers": args.workers,
                           "threads_per_worker": args.threads, "recorded_in_the_runs": recorded_seconds(out, methods, seeds)},
             "load_avg_1_5_15_at_end": list(os.getloadavg()), "cpu_count": os.cpu_count(), "files": files,
             "code": code_version()}
    (out / "study.json").write_text(json.dumps(study, indent=1, default=str) + "\n")
    compact = {k: v for k, v in study.items() if k != "per_run"}  # the copy docs/figures/study/ keeps
    (out / "summary.json").write_text(json.dumps(_rounded(compact), separators=(",", ":"), default=str) + "\n")
    md = [f"# Study, controlled setting\n\n{caption}\n\nCommand: `{command}`\n",
          "## Learning (paired over seeds)\n", learning_markdown(learning, args.threshold)]
    if "ar_lopti" in learning:
        md += ["\n## Learning, paired against AR + Lopti\n", learning_markdown(learning, args.threshold, "ar_lopti")]
    md += ["\n## In training: Fig. 3 by bucket, pooled over each run's steps\n", in_training_markdown(learning)]
    if mechanism is not None:
        md += ["\n## First step from the same weights (compare-methods on each seed's first batch)\n",
               mechanism_markdown(mechanism)]
        if mechanism["not_measured"]:
            md.append(f"\nNot measured by compare-methods: {', '.join(mechanism['not_measured'])}.")
    (out / "tables.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return study
