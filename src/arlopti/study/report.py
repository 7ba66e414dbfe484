"""The toy study's folder: ``study.json`` (every number), ``summary.json`` (the same without the
per-run rewards, floats at 4 significant digits: the copy docs/figures/study/ keeps), ``per_run.json``
(each run's rewards per step and its per-run numbers, exact: also kept in docs/figures/study/, where the
reproduction test reads it), ``tables.md`` and the three figures. The step-matched control's tables
(:func:`~arlopti.study.tables.control_table`) and the between-seed variance of the paired differences
(:func:`~arlopti.study.tables.seed_variance_rows`) are in ``study.json``'s ``step_matched_control``.

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
from arlopti.study.tables import (CONTROL_PAIRS, SECOND_STEP_PAIRS, control_markdown, control_table,
                                  in_training_markdown, learning_markdown, mechanism_counts_markdown,
                                  mechanism_markdown, mechanism_table, method_table, run_summary, seed_variance_rows)


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


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels use here (``AVX2``, ``AVX512``, ...): runs are bit-exact only
    between machines that use the same kernels (tests/study/test_reproduction.py)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


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
    figures = {"curves": plot_curves(learning, caption), "paired": plot_paired(learning, caption=caption),
               "mechanism": plot_mechanism(learning, mechanism, caption)}
    files = {k: Path(save(fig, out / f"{k}.png")).name for k, fig in figures.items()}  # no machine path
    command = getattr(args, "command_line", None)
    control = {"vs_control": control_table(runs, seeds, CONTROL_PAIRS),
               "second_step": control_table(runs, seeds, SECOND_STEP_PAIRS),
               "seed_variance": seed_variance_rows(runs, seeds, args.final_window)}
    study = {"setting": "toy", "command": command, "caption": caption, "methods": methods, "seeds": seeds,
             "sizes": asdict(sizes), "threshold": args.threshold, "final_window": args.final_window,
             "learning": learning, "step_matched_control": control, "mechanism": mechanism,
             "per_run": {m: {str(s): {k: v for k, v in r.items() if k != "in_training"} for s, r in by.items()}
                         for m, by in runs.items()},
             "timings_s": {**timings, "run_s_total": sum(timings["run_s"]), "workers": args.workers,
                           "threads_per_worker": args.threads, "recorded_in_the_runs": recorded_seconds(out, methods, seeds)},
             "load_avg_1_5_15_at_end": list(os.getloadavg()), "cpu_count": os.cpu_count(), "files": files,
             "cpu_capability": cpu_capability(),
             "code": code_version()}
    (out / "study.json").write_text(json.dumps(study, indent=1, default=str) + "\n")
    # per_run.json: every run's rewards per step and its numbers, exact (the reproduction test's record)
    (out / "per_run.json").write_text(json.dumps(study["per_run"], separators=(",", ":")) + "\n")
    compact = {k: v for k, v in study.items() if k != "per_run"}  # the copy docs/figures/study/ keeps
    (out / "summary.json").write_text(json.dumps(_rounded(compact), separators=(",", ":"), default=str) + "\n")
    md = toy_markdown(study, args.threshold)
    (out / "tables.md").write_text(md)
    print(md)
    return study


def toy_markdown(study: dict, threshold: float) -> str:
    """``tables.md`` from ``study.json``'s numbers."""
    learning, mechanism, control = study["learning"], study["mechanism"], study["step_matched_control"]
    md = [f"# Study, controlled setting\n\n{study['caption']}\n\nCommand: `{study['command']}`\n",
          "## Learning (paired over seeds)\n", learning_markdown(learning, threshold)]
    if "ar_lopti" in learning:
        md += ["\n## Learning, paired against AR + Lopti\n", learning_markdown(learning, threshold, "ar_lopti")]
    if control["vs_control"]:
        md += ["\n## The step-matched control: each method against its control, paired by seed\n",
               control_markdown(control["vs_control"], threshold), CONTROL_NOTE]
    if control["second_step"]:
        md += ["\n## What the second step alone does: each control against its one-step method\n",
               control_markdown(control["second_step"], threshold)]
    md += ["\n## In training: Fig. 3 by bucket, pooled over each run's steps\n", in_training_markdown(learning)]
    if mechanism is not None:
        md += ["\n## First step from the same weights (compare-methods on each seed's first batch)\n",
               mechanism_markdown(mechanism)]
        counts = mechanism_counts_markdown(mechanism)
        if counts.count("\n") > 1:
            md += ["\n### The counts behind the first step's A>0 rose fraction\n", counts, COUNTS_NOTE]
        if mechanism["not_measured"]:
            md.append(f"\nNot measured by compare-methods: {', '.join(mechanism['not_measured'])}.")
    return "\n".join(md) + "\n"


CONTROL_NOTE = ("\nThe control (`grpo_two_steps`, `ar_two_steps`) takes Lopti's two passes over the mini-batches per "
                "rollout step with every token in both. Brackets: the 95% bootstrap CI over seeds; braces: the "
                "family-wise CI (Bonferroni over the table's tests, rows x 3); p: the exact sign test over the seeds "
                "that differ, Bonferroni-adjusted in parentheses. Steps: fewer is faster.")
COUNTS_NOTE = ("\nThe token counts are pooled over the seeds and describe; they are not independent samples (the "
               "tokens of one seed's batch share one update). The seed is the unit: the last three columns.")
