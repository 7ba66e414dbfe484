"""bench_python_tool.py at its smallest size (one call of each kind): it runs and writes its fields.
Nothing here is a measurement."""

from __future__ import annotations

import pytest
import json
import math
import sys
from pathlib import Path

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_bench_python_tool_smoke(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_python_tool", BENCH / "bench_python_tool.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_python_tool", module)
    spec.loader.exec_module(module)
    out = tmp_path / "tool.json"
    assert module.main(["--smoke", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["program"] for r in data["rows"]] == ["print", "bwrap_true"] and data["smoke"]
    row = data["rows"][0]
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("sandbox_s", "bare_s", "ratio"))
    assert data["rates"]["gemm_fp32_gflops"] > 0 and data["rates"]["read_gb_s"] > 0
