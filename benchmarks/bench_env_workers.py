"""What an environment's worker processes cost per turn, against the same calls in the trainer's process.

    python benchmarks/bench_env_workers.py [--prompts 8] [--group 8] [--turns 3] [--repeats 5]
                                           [--work none,sleep:20,cpu:5] [--out bench_env_workers.json]
    python benchmarks/bench_env_workers.py --smoke    # 2 x 2 episodes, 1 turn, 1 round: measures nothing

Run it under the machine's lock (``flock /tmp/arlopti-cpu.lock ...``): a timing taken beside another job is
not a measurement.

One **round** is what :class:`arlopti.rollout.turns.TurnLoop` asks of the environment in a rollout step,
without the model: ``--prompts`` x ``--group`` episodes are opened and reset (one batch), answer ``--turns``
steps each (one batch per turn) and are closed, through :class:`arlopti.rollout.env_calls.EnvCalls` (the
counting and the stop rule included). The environment is :class:`WorkEnv` below (text contract), whose
``step`` does ``--work`` before replying: ``none``, ``sleep:<ms>`` (waiting, as on a service or a
subprocess) or ``cpu:<ms>`` (a busy loop). Two placements, alternating round by round
(``_common.interleaved_order``), after one untimed round each:

* ``in_process``: :class:`arlopti.tasks.env.calls.InProcessEnvs` (one call at a time, each in a daemon
  thread: what every environment did before the worker processes);
* ``workers``: :class:`arlopti.tasks.env.workers.EnvWorkers` (one process per episode forked from a host
  that imported the class once; a round's calls all at once). The host is started before the timing, as
  a run starts it at its first round and keeps it.

Per placement and work, the median over ``--repeats`` rounds (>= 5 for a figure) of: the round's wall
seconds; the start (open + resets: the forks, on the workers); a turn (one batch of steps, the median of
the round's turns) and that turn per episode; the end (the trainer's side of close: the workers close
and exit in the background). ``workers / in_process`` is the ratio of the medians. Also recorded: the
fp32 GEMM rate of this machine before and after (``_common.gemm_rate``, 512 x 512, best of 5; other
benchmarks report against it), and the memory of the workers (the host's resident set, and each episode
process's private memory and proportional set size from ``/proc/<pid>/smaps_rollup``, median over the
episodes of one round). The JSON goes to ``benchmarks/out/`` (``_common.write_json``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

from _common import format_table, gemm_rate, interleaved_order, summarise, write_json

HERE = Path(__file__).resolve()


class WorkEnv:
    """Text contract: ``step`` does the row's work (``kind``: none, sleep or cpu; ``ms``), then replies."""

    def reset(self, row):
        self.kind, self.ms, self.n = row["kind"], float(row["ms"]), 0
        return None

    def step(self, text):
        self.n += 1
        if self.kind == "sleep":
            time.sleep(self.ms / 1e3)
        elif self.kind == "cpu":
            end = time.perf_counter() + self.ms / 1e3
            while time.perf_counter() < end:
                pass
        return f"ok {self.n}", False, 0.0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="episodes per prompt")
    ap.add_argument("--turns", type=int, default=3, help="steps per episode")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", default="none,sleep:20,cpu:5", help="what each step does: none, sleep:<ms>, cpu:<ms>")
    ap.add_argument("--timeout", type=float, default=60.0, help="task.env_timeout_s")
    ap.add_argument("--smoke", action="store_true", help="2 x 2 episodes, 1 turn, 1 round, no work")
    ap.add_argument("--out", default="bench_env_workers.json")
    a = ap.parse_args(argv)
    if a.smoke:
        a.prompts, a.group, a.turns, a.repeats, a.work = 2, 2, 1, 1, "none"
    return a


def work_row(work: str) -> dict:
    kind, _, ms = work.partition(":")
    if kind not in ("none", "sleep", "cpu"):
        raise SystemExit(f"--work {work!r}: expected none, sleep:<ms> or cpu:<ms>")
    return {"kind": kind, "ms": float(ms or 0)}


def one_round(calls, keys, row: dict, turns: int) -> dict:
    """Seconds of one round's parts (module docstring) on ``calls``."""
    from arlopti.rollout.env_calls import EnvCall

    t0 = time.perf_counter()
    calls.open(keys)
    calls.run([[EnvCall(k, "reset", (row,), 1, "reset")] for k in keys], fatal=True)
    t1 = time.perf_counter()
    turn_s = []
    for t in range(turns):
        s = time.perf_counter()
        results, _ = calls.run([[EnvCall(k, "step", (f"turn {t}",), 2 + t, "step")] for k in keys])
        turn_s.append(time.perf_counter() - s)
        assert all(r[0].ok for r in results), [r[0] for r in results if not r[0].ok][:1]
    t2 = time.perf_counter()
    calls.end(keys)
    t3 = time.perf_counter()
    calls.end_round()
    return {"round_s": t3 - t0, "start_s": t1 - t0, "turn_s": statistics.median(turn_s), "end_s": t3 - t2}


def _smaps(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0])
    return out


def worker_memory(calls, keys, row: dict) -> dict:
    """The host's resident set and its episode processes' private and proportional memory (MiB) while one
    round's episodes are open (reset, not yet closed)."""
    from arlopti.rollout.env_calls import EnvCall

    calls.open(keys)
    calls.run([[EnvCall(k, "reset", (row,), 1, "reset")] for k in keys], fatal=True)
    host = calls.runner._proc.pid
    kids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == host]
    maps = [_smaps(p) for p in kids]
    calls.end(keys)
    calls.end_round()
    private = [(m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)) / 1024 for m in maps]
    return {"host_rss_mib": _smaps(host)["Rss"] / 1024, "episode_processes": len(kids),
            "episode_private_mib_median": statistics.median(private) if private else None,
            "episode_pss_mib_median": statistics.median(m["Pss"] / 1024 for m in maps) if maps else None}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def placements(timeout_s: float) -> dict:
    """``{name: EnvCalls}`` of the two placements of :class:`WorkEnv` (module docstring)."""
    from arlopti.rollout.env_calls import EnvCalls, InProcessEnvs
    from arlopti.tasks.env.workers import EnvWorkers
    from arlopti.tasks.user_code import load_function

    spec = f"{HERE}:WorkEnv"
    factory = load_function(spec)  # the class as a worker loads it (this script's own __main__ copy is not)
    return {"in_process": EnvCalls("WorkEnv", timeout_s, None, runner=InProcessEnvs(factory, text=True)),
            "workers": EnvCalls("WorkEnv", timeout_s, None, runner=EnvWorkers(spec, "WorkEnv", text=True))}


def measure(a, work: str, calls: dict, keys) -> list[dict]:
    row, n = work_row(work), a.prompts * a.group
    for c in calls.values():  # untimed: the host's start, first imports
        one_round(c, [next(keys) for _ in range(n)], row, a.turns)
    samples = {name: [] for name in calls}
    for name in interleaved_order(list(calls), a.repeats):
        samples[name].append(one_round(calls[name], [next(keys) for _ in range(n)], row, a.turns))
    rows = []
    for name, got in samples.items():
        med = {k: statistics.median(s[k] for s in got) for k in got[0]}
        rows.append({"work": work, "placement": name, "episodes": n, "turns": a.turns, **med,
                     "turn_ms_per_episode": 1e3 * med["turn_s"] / n, "round_s_summary": summarise([s["round_s"] for s in got]),
                     "turn_s_summary": summarise([s["turn_s"] for s in got])})
    base = rows[0]
    for r in rows:
        r["round_ratio"] = r["round_s"] / base["round_s"] if base["round_s"] > 0 else None
        r["turn_ratio"] = r["turn_s"] / base["turn_s"] if base["turn_s"] > 0 else None
    return rows


def main(argv=None) -> int:
    import torch

    a = parse_args(argv)
    gemm_before = gemm_rate(512, torch.float32, 5) / 1e9
    calls = placements(a.timeout)
    keys = itertools.count()
    try:
        rows = [r for work in a.work.split(",") for r in measure(a, work, calls, keys)]
        memory = worker_memory(calls["workers"], [next(keys) for _ in range(a.prompts * a.group)], work_row("none"))
    finally:
        for c in calls.values():
            c.close()
    gemm_after = gemm_rate(512, torch.float32, 5) / 1e9
    print(format_table(rows, ["work", "placement", "episodes", "round_s", "start_s", "turn_s", "turn_ms_per_episode",
                              "end_s", "round_ratio", "turn_ratio"]))
    print(f"workers' memory: {memory}; fp32 GEMM {gemm_before:.1f} -> {gemm_after:.1f} GFLOP/s")
    path = write_json(a.out, {"settings": vars(a), "rows": rows, "memory": memory,
                              "gemm_fp32_gflops": {"before": gemm_before, "after": gemm_after}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
