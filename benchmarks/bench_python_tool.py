"""What the OS sandbox costs the Python tool per call: ``run_python`` in bubblewrap against the same child
without it (``sandbox=False``: the interpreter, limits, output cap and kill as before, the sandbox left out).

    python benchmarks/bench_python_tool.py [--repeats 9] [--out benchmarks/out/bench_python_tool.json]
    python benchmarks/bench_python_tool.py --smoke     # 1 repeat of the smallest program: measures nothing

Programs, each a typical code block of the math-tool episodes:

* ``print``: ``print(6 * 7)``, the fixed cost of a call (an interpreter, its limits, the sandbox);
* ``sympy``: importing sympy and factoring a number, the common ToRL block (the import dominates);
* ``bwrap_true``: ``bwrap`` with the same flags running ``/bin/true``, the sandbox's start-up alone.

Each is run ``--repeats`` times, sandboxed and bare interleaved (``_common.alternating_timings``), after one
untimed round; the table gives the median, min and max seconds per call, the sandboxed / bare ratio of the
medians and the overhead in milliseconds. The machine's GEMM and read rates are recorded beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

PROGRAMS = {"print": "print(6 * 7)", "sympy": "import sympy\nprint(sympy.factorint(2024))"}


def _bwrap_true() -> None:
    from arlopti.tasks.env.sandbox import bwrap_args, sandbox_env

    with tempfile.TemporaryDirectory(prefix="arlopti-bench-") as workdir:
        workdir = os.path.realpath(workdir)
        subprocess.run([*bwrap_args(workdir), "/bin/true"], env=sandbox_env(workdir), check=True)


def measure(repeats: int, programs: dict[str, str]) -> list[dict]:
    """One row per program: sandboxed and bare seconds per call, interleaved."""
    from arlopti.tasks.env.python_tool import PythonLimits, run_python

    limits = PythonLimits(cpu_s=20, wall_s=60)
    rows = []
    for name, code in programs.items():
        def call(sandbox: bool, code=code):
            result = run_python(code, limits, sandbox=sandbox)
            assert result.ok, result.output
        times = _common.alternating_timings({"sandbox": lambda: call(True), "bare": lambda: call(False)}, repeats)
        box, bare = _common.summarise(times["sandbox"]), _common.summarise(times["bare"])
        rows.append({"program": name, "sandbox_s": box["median"], "sandbox_min_s": box["min"],
                     "sandbox_max_s": box["max"], "bare_s": bare["median"], "ratio": box["median"] / bare["median"],
                     "overhead_ms": 1e3 * (box["median"] - bare["median"]), "n": box["n"]})
    start = _common.alternating_timings({"bwrap_true": _bwrap_true}, repeats)["bwrap_true"]
    rows.append({"program": "bwrap_true", "sandbox_s": _common.summarise(start)["median"], "n": len(start)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default="bench_python_tool.json", help="file name under benchmarks/out/ (or a path)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be >= 1")
    programs = {"print": PROGRAMS["print"]} if args.smoke else PROGRAMS
    rows = measure(1 if args.smoke else args.repeats, programs)
    import torch

    rates = {"gemm_fp32_gflops": _common.gemm_rate(1024, torch.float32, 1 if args.smoke else 5) / 1e9,
             "read_gb_s": _common.read_bandwidth(64 if args.smoke else 512, 1 if args.smoke else 5) / 1e9}
    print(_common.format_table(rows, ["program", "sandbox_s", "sandbox_min_s", "sandbox_max_s", "bare_s", "ratio",
                                      "overhead_ms", "n"]))
    print(f"machine: fp32 GEMM {rates['gemm_fp32_gflops']:.0f} GFLOP/s, read {rates['read_gb_s']:.1f} GB/s")
    print("wrote", _common.write_json(args.out, {"rows": rows, "rates": rates, "smoke": args.smoke}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
