"""Which CPU kernel reads a decoding step's weights fastest: ``F.linear`` (MKL's sgemm), oneDNN on a
reordered weight (``torch.ops.mkldnn._reorder_linear_weight`` + ``_linear_pointwise``, what
``arlopti.rollout.packed_linear`` uses) and MKL's packed GEMM (``torch.ops.mkl._mkl_linear``), on the
weight shapes of SmolLM2-135M (hidden 576, MLP 1536, k/v 192, vocabulary 49,152) at each batch.

    python benchmarks/bench_linear_kernels.py [--batches 8,32] [--calls 30]
    python benchmarks/bench_linear_kernels.py --smoke      # one small shape, 2 calls: measures nothing

Each figure is GB/s of weights read per product (fp32 bytes of the weight / median seconds of
``--calls`` calls after 3 untimed ones), with torch's threads; ``max_abs_diff`` is oneDNN's largest
difference from ``F.linear`` on N(0, 1) inputs (the summation order differs). The machine's fp32 GEMM and
read rates are recorded with them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

SHAPES = [(1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576)]


def _median_s(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(shapes, batches, calls: int) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for out, inp in shapes:
        w = torch.randn(out, inp)
        for batch in batches:
            x = torch.randn(batch, inp)
            onednn = torch.ops.mkldnn._reorder_linear_weight(w, batch)
            mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, batch)
            kernels = {"f_linear": lambda: F.linear(x, w),
                       "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""),
                       "mkl_packed": lambda: torch.ops.mkl._mkl_linear(x, mkl, w, None, batch)}
            gb = out * inp * 4 / 1e9
            row = {"weight": f"{out}x{inp}", "batch": batch}
            row.update({f"{k}_gb_s": gb / _median_s(fn, calls) for k, fn in kernels.items()})
            row["max_abs_diff"] = (kernels["onednn"]() - kernels["f_linear"]()).abs().max().item()
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default="bench_linear_kernels.json", help="file name under benchmarks/out/ (or a path)")
    args = parser.parse_args(argv)
    if args.calls < 5 and not args.smoke:
        parser.error(f"--calls={args.calls}: the median needs at least 5")
    batches = [2] if args.smoke else [int(b) for b in args.batches.split(",")]
    rows = measure([(64, 32)] if args.smoke else SHAPES, batches, 2 if args.smoke else args.calls)
    rates = {"gemm_fp32_gflops": _common.gemm_rate(256 if args.smoke else 1024, torch.float32, 5) / 1e9,
             "read_gb_s": _common.read_bandwidth(64 if args.smoke else 1024, 5) / 1e9}
    print(_common.format_table(rows, ["weight", "batch", "f_linear_gb_s", "onednn_gb_s", "mkl_packed_gb_s",
                                      "max_abs_diff"]))
    print(f"machine: fp32 GEMM {rates['gemm_fp32_gflops']:.1f} GFLOP/s, read {rates['read_gb_s']:.1f} GB/s, "
          f"{torch.get_num_threads()} threads")
    print("wrote", _common.write_json(args.out, {"rows": rows, "rates": rates, "smoke": args.smoke}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
