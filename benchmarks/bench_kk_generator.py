"""K&K generator throughput: rendered puzzles per second for N = 3, 5 and 8.

    python benchmarks/bench_kk_generator.py [--quick] [--out benchmarks/out/bench_kk_generator.json]
    python benchmarks/bench_kk_generator.py --smoke    # 5 puzzles per N, 50 raw draws, one repeat: measures nothing

For each N it times, on one core of whatever machine runs it (the CPU count is printed):

* ``rendered/s``: :func:`arlopti.tasks.kk.sample_puzzles` (sampling, uniqueness filter, names,
  English) for ``--count`` puzzles (1,000; 200 with ``--quick``), seed 1234;
* ``logical/s``: :func:`sample_logical_puzzles` alone (no English);
* ``accept``: the fraction of raw draws with exactly one solution (the uniqueness filter's
  acceptance rate, measured on 20,000 raw draws; 4,000 with ``--quick``);
* ``solve us``: microseconds per :func:`solve` call on the accepted puzzles.

Best of three repeats for the timed parts. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from _common import write_json  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from arlopti.tasks.kk import sample_logical_puzzles, sample_puzzles, solve
from arlopti.tasks.kk.generator import StatementSampler
from arlopti.tasks.kk.solver import count_solutions

PEOPLE = (3, 5, 8)


REPEATS = 3


def best_of(fn, repeats: int | None = None) -> float:
    times = []
    for _ in range(repeats or REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(n: int, count: int, raw_draws: int, repeats: int = REPEATS) -> dict:
    rendered_s = best_of(lambda: sample_puzzles(n, count, seed=1234), repeats)
    logical_s = best_of(lambda: sample_logical_puzzles(n, count, seed=1234), repeats)
    sampler = StatementSampler(np.random.default_rng(0), n)
    accepted = sum(count_solutions(sampler.puzzle(), n) == 1 for _ in range(raw_draws))
    puzzles = [s for s, _ in sample_logical_puzzles(n, count, seed=1234)]
    solve_s = best_of(lambda: [solve(s, n) for s in puzzles], repeats)
    return {
        "num_people": n, "count": count,
        "rendered_per_s": count / rendered_s, "logical_per_s": count / logical_s,
        "acceptance": accepted / raw_draws, "solve_us": solve_s / count * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer puzzles (200 per N)")
    parser.add_argument("--count", type=int, default=None, help="puzzles per N (default 1000, quick 200)")
    parser.add_argument("--smoke", action="store_true", help="5 puzzles per N, 50 raw draws, one repeat")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "bench_kk_generator.json")
    args = parser.parse_args(argv)
    count = args.count or (5 if args.smoke else 200 if args.quick else 1000)
    raw = 50 if args.smoke else 4000 if args.quick else 20000

    rows = [measure(n, count, raw, 1 if args.smoke else REPEATS) for n in PEOPLE]
    print(f"K&K generator, {count} puzzles per N, seed 1234, {os.cpu_count()} CPUs (one used)")
    print(f"{'N':>3} {'rendered/s':>11} {'logical/s':>10} {'accept':>7} {'solve us':>9}")
    for r in rows:
        print(f"{r['num_people']:>3} {r['rendered_per_s']:>11.0f} {r['logical_per_s']:>10.0f} "
              f"{r['acceptance']:>7.3f} {r['solve_us']:>9.1f}")
    path = write_json(str(args.out), {"quick": args.quick, "smoke": args.smoke, "count": count,
                                      "cpus": os.cpu_count(), "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
