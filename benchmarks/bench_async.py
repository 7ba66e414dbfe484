"""Rollout steps per hour of ``rollout.placement=server`` at ``max_staleness`` 0, 1, 2 against colocated.

Issue 27's measurement. Workload: SmolLM2-135M-Instruct (offline, ``model=smollm2-135m-instruct``),
GRPO (``experiment=kk_grpo``) on generated K&K puzzles (``data=kk_generated``), 2 prompts x group
size 4 = **8 responses per step of at most 128 new tokens** (``rollout.max_new_tokens=128``; a response
may stop earlier at EOS, so the median response length is reported beside every row), one mini-batch
of 8 in micro-batches of 4, fp32, no reference model (``algorithm.kl_coef=0``), no validation, no
checkpoints, no diagnostics callback.

Configurations (one ``train.py`` subprocess each, ``--steps`` rollout steps):

* ``colocated``: ``rollout.backend=vllm`` in the trainer's process, ``taskset -c 0,1`` (both cores);
* ``server_k{0,1,2}``: ``rollout.placement=server rollout.async.max_staleness=k``, the trainer under
  ``taskset -c 0`` with ``OMP_NUM_THREADS=1`` (torch threads 1), its spawned worker under
  ``rollout.server.cpus=1``: one core each.

**Steady state, start-up excluded.** Every step writes one ``arlopti.progress`` line to the run's
``train.log``, time-stamped to the millisecond. The step time of a run is
``(t[N] - t[skip]) / (N - skip)`` with ``t[i]`` the time stamp of step ``i``'s line (1-based), so
everything before the end of step ``skip`` -- process start, model load, the vLLM engine or server
start, the first weight sync, and (default ``--skip 1``) the first step, which fills the
generate-ahead pipeline -- is not counted (on the 2-core CPU the first step line comes about 40 s
(colocated) and 90 s (server) after the process starts). Rollout steps per hour = 3600 / step time. The median over
the steady steps of the step metrics ``timing/rollout_s`` (the trainer's wait for generation),
``timing/update_s``, ``timing/logprobs_s`` and ``timing/sync_s`` come from the run's
``csv/metrics.csv`` (``logger=csv``); with ``max_staleness=0`` (and colocated) the wait is the whole
generation time of a batch, with ``k >= 1`` only the part the update did not hide.

Rounds: round ``r`` runs every configuration once, the order rotated each round
(``_common.interleaved_order``); the table reports per configuration the median over rounds and the
ratio of medians against ``colocated``. Run it under the shared CPU lock, whole::

    flock /tmp/arlopti-cpu.lock .venv/bin/python benchmarks/bench_async.py --rounds 5 --steps 2 --skip 1

(40 min on 2 cores, benchmarks/RESULTS.md); ``--rounds 1 --steps 3`` is a dry run. ``--smoke`` runs the
workload once on the tiny model with the HF engine (configuration ``smoke``: no vLLM, 8 tokens, 2 steps),
which checks the overrides, the log lines and the CSV it reads, and measures nothing. Output: a markdown
table on stdout and ``benchmarks/out/bench_async.json`` (``benchmarks/async_model.py`` reads it).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import _common
from _common import REPO, interleaved_order, write_json

MODEL = "smollm2-135m-instruct"
#: The workload (module docstring), on top of experiment=kk_grpo.
WORKLOAD = [
    "experiment=kk_grpo", f"model={MODEL}", "data=kk_generated", "trainer=cpu", "trainer.precision=32-true",
    "logger=csv", "sizes.prompts_per_step=2", "sizes.group_size=4", "sizes.mini_batch_size=8",
    "sizes.micro_batch_size=4", "sizes.logprob_micro_batch_size=8", "rollout.max_new_tokens=128",
    "rollout.generation_batch_size=8", "rollout.dtype=null", "rollout.enable_sleep=false",
    "rollout.gpu_memory_utilization=0.2", "model.ref_dtype=null", "algorithm.kl_coef=0.0",
    "data.train_people=[2,3]", "callbacks.benchmark_eval=null", "callbacks.model_checkpoint=null",
    "callbacks.diagnostics=null", "callbacks.rich_progress_bar=null",
    "+trainer.enable_checkpointing=false",  # Lightning's own end-of-run checkpoint: 1.6 GB per run
]
#: name -> (CPU list for taskset, extra env, extra overrides)
CONFIGS: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "colocated": ("0,1", {}, ["rollout.backend=vllm"]),
    **{f"server_k{k}": ("0", {"OMP_NUM_THREADS": "1"},
                        ["rollout.placement=server", f"rollout.async.max_staleness={k}", "rollout.server.cpus=1"])
       for k in (0, 1, 2)},
}
#: --smoke's configuration: the workload on the tiny model and the HF engine, on both cores.
SMOKE = ("0,1", {}, ["model=tiny", "rollout.backend=hf", "rollout.max_new_tokens=8", "data.max_prompt_length=4096",
                     "data.train_count_per_n=4",
                     "data.val_count_per_n=1"])
METRICS = {"rollout_s": "timing/rollout_s", "update_s": "timing/update_s", "logprobs_s": "timing/logprobs_s",
           "sync_s": "timing/sync_s",
           "response_len": "rollout/response_len_mean"}
STEP_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[arlopti\.progress\]\[INFO\] - step (\d+)/")


def step_times(train_log: str) -> dict[int, float]:
    """``{step: POSIX time of its progress line}`` from a run's ``train.log`` text."""
    out = {}
    for line in train_log.splitlines():
        m = STEP_LINE.match(line)
        if m:
            out[int(m.group(2))] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def steady_step_s(times: dict[int, float], skip: int) -> float:
    """``(t[N] - t[skip]) / (N - skip)``, N the last step (module docstring)."""
    last = max(times, default=-1)
    if skip not in times or last <= skip:
        raise ValueError(f"need the lines of step {skip} and of a later one, got steps {sorted(times)}")
    return (times[last] - times[skip]) / (last - skip)


def steady_metrics(metrics_csv: Path, skip: int) -> dict[str, float | None]:
    """Median of each :data:`METRICS` column over the rows of steps after ``skip`` (None if absent)."""
    with metrics_csv.open() as f:
        rows = [r for r in csv.DictReader(f)]
    rows = rows[skip:]  # one row per rollout step, in order
    out: dict[str, float | None] = {}
    for name, tag in METRICS.items():
        vals = [float(r[tag]) for r in rows if r.get(tag) not in (None, "")]
        out[name] = statistics.median(vals) if vals else None
    return out


def run_config(name: str, steps: int, skip: int, run_dir: Path, timeout_s: float) -> dict:
    """One ``train.py`` subprocess of configuration ``name``; its steady step time and metrics."""
    cpus, env, extra = SMOKE if name == "smoke" else CONFIGS[name]
    cmd = ["taskset", "-c", cpus, sys.executable, "train.py", *WORKLOAD, *extra, f"rollout_steps={steps}",
           f"hydra.run.dir={run_dir}"]
    start, t0 = time.time(), time.perf_counter()
    code, stderr = launch(cmd, env, timeout_s)
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{name} failed (exit {code}): {' '.join(cmd)}\n{stderr[-3000:]}")
    times = step_times((run_dir / "train.log").read_text())
    step_s = steady_step_s(times, skip)
    return {"config": name, "step_s": step_s, "steps_per_hour": 3600.0 / step_s, "wall_s": wall,
            "first_step_line_after_s": times[min(times)] - start,
            **steady_metrics(run_dir / "csv" / "metrics.csv", skip)}


def launch(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """Run one ``train.py`` command line from the repository root: (exit status, stderr)."""
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s)
    return proc.returncode, proc.stderr


def summarise(samples: list[dict]) -> list[dict]:
    """Per configuration: medians over rounds of every number, and the ratios against colocated."""
    rows = []
    for name in [*CONFIGS, "smoke"]:
        mine = [s for s in samples if s["config"] == name]
        if not mine:
            continue
        row = {"config": name, "n": len(mine)}
        for key in ("steps_per_hour", "step_s", *METRICS):
            vals = [s[key] for s in mine if s.get(key) is not None]
            row[key] = statistics.median(vals) if vals else None
        rows.append(row)
    base = next((r for r in rows if r["config"] == "colocated"), None)
    for r in rows:
        r["vs_colocated"] = r["steps_per_hour"] / base["steps_per_hour"] if base else None
    return rows


def markdown(rows: list[dict]) -> str:
    """The house table: one row per configuration."""
    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    head = ("| config | cores | n | rollout steps / h (median) | / colocated | step s | rollout wait s | "
            "logprobs s | update s | sync s | response len |")
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        cores = "trainer 0,1 (shared)" if r["config"] == "colocated" else "trainer 0, worker 1"
        lines.append(f"| `{r['config']}` | {cores} | {r['n']} | {f(r['steps_per_hour'], '{:.0f}')} | "
                     f"{f(r['vs_colocated'], '{:.3f}')} | {f(r['step_s'])} | {f(r['rollout_s'])} | "
                     f"{f(r['logprobs_s'])} | {f(r['update_s'])} | {f(r['sync_s'])} | "
                     f"{f(r['response_len'], '{:.0f}')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="each configuration runs once per round")
    p.add_argument("--steps", type=int, default=2, help="rollout steps per run")
    p.add_argument("--skip", type=int, default=1, help="steps not counted (pipeline fill); must be < --steps")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {list(CONFIGS)}")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--smoke", action="store_true", help="one run of the tiny model with the HF engine: measures nothing")
    p.add_argument("--out", default="bench_async.json", help="file name under benchmarks/out/ (or a path)")
    args = p.parse_args(argv)
    if args.smoke:
        args.configs, args.rounds, args.steps, args.skip = "smoke", 1, 2, 1
    names = [c for c in args.configs.split(",") if c]
    unknown = set(names) - set(CONFIGS) - ({"smoke"} if args.smoke else set())
    if unknown or args.skip >= args.steps or args.skip < 1:
        p.error(f"unknown configs {sorted(unknown)} or --skip {args.skip} not in [1, --steps)")
    runs = Path(_common.OUT_DIR) / "bench_async_runs" / time.strftime("%Y%m%d-%H%M%S")
    samples: list[dict] = []
    order = list(interleaved_order(names, args.rounds))
    for i, name in enumerate(order):
        res = run_config(name, args.steps, args.skip, runs / f"{i:02d}_{name}", args.timeout)
        res["round"] = i // len(names)
        samples.append(res)
        print(f"[{i + 1}/{len(order)}] {name}: {res['step_s']:.2f} s/step, {res['steps_per_hour']:.0f} steps/h "
              f"(run wall {res['wall_s']:.0f} s)", flush=True)
        # written after every run, so that an interrupted benchmark keeps its finished rounds
        rows = summarise(samples)
        path = write_json(args.out, {"workload": WORKLOAD, "configs": {k: list(v) for k, v in CONFIGS.items()},
                                     "rounds": args.rounds, "rounds_done": len(samples) // len(names),
                                     "steps": args.steps, "skip": args.skip, "samples": samples, "summary": rows})
    print(markdown(rows))
    print(f"wrote {path}")
    return {"samples": samples, "summary": rows}


if __name__ == "__main__":
    main()
