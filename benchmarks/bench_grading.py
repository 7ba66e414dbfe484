"""Math grading throughput, and the no-zombie check over many gradings with timeouts.

    python benchmarks/bench_grading.py [--quick] [--workers 2] [--out benchmarks/out/bench_grading.json]
    python benchmarks/bench_grading.py --smoke    # 20 responses, 100 gradings, 1 worker: measures nothing

Part 1 - throughput on a synthetic mixed batch of 1,000 responses (about 35% correct,
25% wrong, 20% symbolically equivalent, 15% without a box, 5% adversarial), every response
distinct so that batch de-duplication does not flatter us:

* ``ours``: ``MathGrader(num_workers=W).grade_batch`` (in-process string/numeric fast path,
  math-verify in W worker processes with a hard timeout);
* ``naive``: math-verify ``parse`` + ``verify`` on every response in this process, the way
  many RL reward functions call it (no fast path, no isolation). It runs on the
  non-adversarial part only: on the adversarial part it can hang (that is the point of the
  pool), so the speed ratio is reported on the same non-adversarial responses.

Part 2 - 10,000 gradings (1,000 with ``--quick``) in batches of 500 with a short timeout,
1% of them built to time out; afterwards the grader is closed and the script counts this
process's remaining children and zombies (both must be 0).

Timings are wall-clock on whatever this machine has; the number of CPUs is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from _common import write_json  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from arlopti.tasks.math import MathGrader
from arlopti.tasks.math.extract import last_boxed


def mixed_batch(n: int) -> tuple[list[str], list, list[bool]]:
    """``n`` (response, gold, is_adversarial) triples in a fixed, interleaved mix."""
    responses, golds, adversarial = [], [], []
    pad = "Let me think. " * 40  # about 560 characters of reasoning before the answer
    for i in range(n):
        k = i + 2
        r = i % 20
        if r < 7:  # correct: same string or same number
            if r % 2:
                resp, gold = f"\\boxed{{{k * 3}}}", str(k * 3)
            else:
                resp, gold = f"\\boxed{{\\frac{{{k}}}{{{k + 1}}}}}", f"\\dfrac{{{k}}}{{{k + 1}}}"
        elif r < 12:  # wrong
            if r % 2:
                resp, gold = f"\\boxed{{{k * 3 + 1}}}", float(k * 3)
            else:
                resp, gold = f"\\boxed{{x^{{{k}}}+1}}", f"x^{{{k}}}-1"
        elif r < 16:  # symbolically equivalent
            if r % 2:
                resp, gold = f"\\boxed{{\\frac{{{k}\\sqrt{{8}}}}{{2}}}}", f"{k}\\sqrt{{2}}"
            else:
                resp, gold = f"\\boxed{{x^2+{2 * k}x+{k * k}}}", f"(x+{k})^2"
        elif r < 19:  # no box
            resp, gold = f"I think it is {k}.", str(k)
        else:  # adversarial: guarded power towers, huge literals, a simplify bomb
            j = (i // 20) % 3
            resp = [f"\\boxed{{9^{{9^{{{k}}}}}}}", "\\boxed{" + "7" * 900 + f"{k}}}",
                    f"\\boxed{{(x+1)^{{{90000 + k}}}-(x-1)^{{{90000 + k}}}}}"][j]
            gold = "1"
        responses.append(pad + resp)
        golds.append(gold)
        adversarial.append(r == 19)
    return responses, golds, adversarial


def naive_grade(responses: list[str], golds: list) -> list[float]:
    """math-verify on every response, in this process (the baseline; trusted inputs only)."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out = []
    for resp, gold in zip(responses, golds):
        g = gold if isinstance(gold, str) else str(int(gold)) if float(gold).is_integer() else str(gold)
        box = last_boxed(resp)
        if box is None:
            out.append(0.0)
            continue
        out.append(float(verify(parse(f"${g}$"), parse(f"${box}$"))))
    return out


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def children_report(pids) -> dict:
    import psutil

    kids = psutil.Process().children(recursive=True)
    ours = [c for c in kids if c.pid in set(pids)]
    return {"children": len(kids), "grader_children": len(ours),
            "zombies": sum(c.status() == psutil.STATUS_ZOMBIE for c in kids)}


def zombie_check(gradings: int, workers: int, timeout_s: float) -> dict:
    grader = MathGrader(num_workers=workers, timeout_s=timeout_s)
    hows: Counter = Counter()
    start = time.perf_counter()
    batch = 500
    for b in range(0, gradings, batch):
        resp, gold = [], []
        for i in range(b, min(b + batch, gradings)):
            if i % 100 == 0:  # 1%: an expansion that runs past the timeout
                resp.append(f"\\boxed{{(x+1)^{{{90000 + i}}}-(x-1)^{{{90000 + i}}}}}")
                gold.append("0")
            elif i % 4 == 0:
                resp.append(f"\\boxed{{\\frac{{{i}\\sqrt{{8}}}}{{2}}}}")
                gold.append(f"{i}\\sqrt{{2}}")
            else:
                resp.append(f"\\boxed{{{i}}}")
                gold.append(str(i + i % 2))
        hows.update(d.how for d in grader.grade_detailed(resp, gold))
    elapsed = time.perf_counter() - start
    pool = grader.pool
    stats = dict(pool.stats)
    during = children_report(pool.spawned_pids)
    grader.close()
    after = children_report(pool.spawned_pids)
    return {"gradings": gradings, "timeout_s": timeout_s, "seconds": round(elapsed, 2),
            "how": dict(hows), "pool_stats": stats, "live_before_close": during,
            "after_close": after, "ok": after["grader_children"] == 0 and after["zombies"] == 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300-response batch and 1,000 zombie-check gradings")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3.0, help="grader timeout for part 1")
    ap.add_argument("--smoke", action="store_true", help="20 responses and 100 zombie-check gradings, 1 worker")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "bench_grading.json")
    args = ap.parse_args(argv)
    n = 20 if args.smoke else 300 if args.quick else 1000
    gradings = 100 if args.smoke else 1000 if args.quick else 10_000
    if args.smoke:
        args.workers, args.timeout = 1, 1.0

    responses, golds, adversarial = mixed_batch(n)
    safe = [i for i, a in enumerate(adversarial) if not a]
    safe_resp, safe_gold = [responses[i] for i in safe], [golds[i] for i in safe]

    rows = []
    with MathGrader(num_workers=args.workers, timeout_s=args.timeout) as grader:
        grader.grade("\\boxed{\\sqrt8}", "2\\sqrt2")  # start the workers outside the timing
        details, t_all = timed(grader.grade_detailed, responses, golds)
        ours_safe, t_safe = timed(grader.grade_batch, safe_resp, safe_gold)
        stats = dict(grader.pool.stats)
    naive, t_naive = timed(naive_grade, safe_resp, safe_gold)
    agree = sum(a == b for a, b in zip(ours_safe, naive)) / len(safe)
    rows.append(("ours, full mix", n, t_all, n / t_all))
    rows.append(("ours, non-adversarial", len(safe), t_safe, len(safe) / t_safe))
    rows.append(("naive in-process, non-adversarial", len(safe), t_naive, len(safe) / t_naive))
    ratio = (len(safe) / t_safe) / (len(safe) / t_naive)

    print(f"CPUs: {os.cpu_count()}  workers: {args.workers}  timeout: {args.timeout} s")
    print(f"{'mode':36} {'responses':>9} {'seconds':>8} {'resp/s':>9}")
    for name, count, secs, rate in rows:
        print(f"{name:36} {count:9d} {secs:8.2f} {rate:9.1f}")
    print(f"speed-up ours / naive (non-adversarial): {ratio:.1f}x; reward agreement {agree:.1%}")
    print(f"full-mix verdicts: {dict(Counter(d.how for d in details))}")

    zombies = zombie_check(gradings, args.workers, timeout_s=0.3)
    print(f"zombie check: {zombies['gradings']} gradings in {zombies['seconds']} s, "
          f"{zombies['pool_stats']['killed_timeout']} timeouts killed, {zombies['pool_stats']['spawned']} "
          f"workers spawned; after close: {zombies['after_close']} -> {'OK' if zombies['ok'] else 'LEAK'}")

    report = {
        "cpus": os.cpu_count(), "workers": args.workers, "timeout_s": args.timeout, "quick": args.quick,
        "smoke": args.smoke,
        "throughput": [{"mode": m, "responses": c, "seconds": round(s, 3), "responses_per_s": round(r, 1)}
                       for m, c, s, r in rows],
        "speedup_vs_naive_non_adversarial": round(ratio, 2), "reward_agreement_with_naive": round(agree, 4),
        "full_mix_how": dict(Counter(d.how for d in details)), "pool_stats_part1": stats,
        "zombie_check": zombies,
    }
    print(f"wrote {write_json(str(args.out), report)}")
    return 0 if zombies["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
