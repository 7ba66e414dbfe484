"""Worst-case wall time of grading one batch: 10 distinct pathological math answers (sympy
"expand bombs" such as ``(x+1)**90000-(x-1)**90000``), each of which runs to the per-answer
timeout, graded by ``MathTask`` with its defaults (2 workers, 3 s timeout, and the per-batch
budget ``batch_budget_s``), workers already started.

    python benchmarks/bench_grading_worst_case.py [--grader official|math_verify] [--budget S|none]
    python benchmarks/bench_grading_worst_case.py --smoke    # 2 bombs, 1 worker, 0.5 s timeout: measures nothing

``--budget none`` is the behaviour before the per-batch budget (each bomb costs the full timeout,
two at a time). Prints the wall time and how many answers ended as ``timeout`` and ``budget``, and
writes them to ``benchmarks/out/bench_grading_worst_case.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import time

from _common import write_json  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from arlopti.tasks.base import get_task


def bombs(grader: str, count: int = 10) -> tuple[list[str], str]:
    if grader == "official":  # the official grader parses sympy syntax
        return [f"\\boxed{{(x+1)**{90000 + i}-(x-1)**{90000 + i}}}" for i in range(count)], "x"
    return [f"\\boxed{{(x+1)^{{{90000 + i}}}-(x-1)^{{{90000 + i}}}}}" for i in range(count)], "0"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grader", default="official", choices=["official", "math_verify"])
    ap.add_argument("--budget", default="default", help="seconds, 'none' (no budget) or 'default' (MathTask's)")
    ap.add_argument("--smoke", action="store_true", help="2 bombs, 1 worker, a 0.5 s timeout: a check that it runs")
    ap.add_argument("--out", default="bench_grading_worst_case.json", help="file name under benchmarks/out/ (or a path)")
    a = ap.parse_args(argv)
    kwargs = {"grader": a.grader, "num_workers": 1 if a.smoke else 2}
    if a.smoke:
        kwargs["timeout_s"] = 0.5
    if a.budget != "default":
        kwargs["batch_budget_s"] = None if a.budget == "none" else float(a.budget)
    task = get_task("math", **kwargs)
    try:
        task.score(["\\boxed{\\sqrt8}"], ["2\\sqrt2"], [{}])  # start the workers
        answers, gold = bombs(a.grader, 2 if a.smoke else 10)
        t0 = time.monotonic()
        out = task.score(answers, [gold] * len(answers), [{}] * len(answers))
        wall = time.monotonic() - t0
    finally:
        task.close()
    timeouts = sum(r.components.get("timeout", 0) for r in out)
    budget = sum(r.components.get("budget", 0) for r in out)
    print(f"{a.grader}, budget {a.budget}: {wall:.1f} s for {len(answers)} distinct pathological answers "
          f"(timeout {timeouts:.0f}, budget {budget:.0f})")
    result = {"grader": a.grader, "budget": a.budget, "smoke": a.smoke, "answers": len(answers), "wall_s": wall,
              "timeout": timeouts, "budget_ran_out": budget, "task": kwargs}
    print(f"wrote {write_json(a.out, result)}")
    return result


if __name__ == "__main__":
    main()
