"""benchmarks/bench_env_workers.py at its smallest size (--smoke), so that it does not rot: it runs both
placements through its main(argv), writes its JSON, and leaves no worker process behind. Nothing here is
a measurement, and no number is compared with a bound."""

from __future__ import annotations

import pytest
import importlib.util
import json
import sys
from pathlib import Path

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def test_bench_env_workers_smoke(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    import _common

    monkeypatch.setattr(_common, "OUT_DIR", tmp_path)
    spec = importlib.util.spec_from_file_location("bench_env_workers", BENCH / "bench_env_workers.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_env_workers", module)
    spec.loader.exec_module(module)
    assert module.main(["--smoke", "--out", "env_workers.json"]) == 0
    data = json.loads((tmp_path / "env_workers.json").read_text())
    assert data["command"] and data["machine"]["cpu"]
    assert [(r["placement"], r["episodes"], r["turns"]) for r in data["rows"]] == [("in_process", 4, 1), ("workers", 4, 1)]
    assert all(r["round_s"] > 0 and r["turn_s"] > 0 for r in data["rows"]) and data["rows"][0]["round_ratio"] == 1
    assert data["memory"]["episode_processes"] == 4 and data["memory"]["host_rss_mib"] > 0
    assert data["gemm_fp32_gflops"]["before"] > 0 and data["gemm_fp32_gflops"]["after"] > 0
    hosts = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_host_of_mine(p)]
    assert not hosts, "a worker host outlived the benchmark"


def _is_host_of_mine(proc: Path) -> bool:
    import os

    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"worker_host" in cmdline and " Z " not in stat
