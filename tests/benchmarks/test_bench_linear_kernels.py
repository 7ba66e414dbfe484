"""bench_linear_kernels.py at its smallest size: it runs and writes its fields. Nothing here is a measurement."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_bench_linear_kernels_smoke(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_linear_kernels", BENCH / "bench_linear_kernels.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_linear_kernels", module)
    spec.loader.exec_module(module)
    out = tmp_path / "kernels.json"
    assert module.main(["--smoke", "--out", str(out)]) == 0
    row, = json.loads(out.read_text())["rows"]
    assert (row["weight"], row["batch"]) == ("64x32", 2)
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("f_linear_gb_s", "onednn_gb_s", "mkl_packed_gb_s"))
    assert row["max_abs_diff"] < 1e-3
