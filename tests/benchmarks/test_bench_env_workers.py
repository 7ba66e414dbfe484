"""benchmarks/bench_env_workers.py at its smallest size (--smoke), so that it does not rot: it runs both
placements through its main(argv), writes its JSON, and leaves no worker process behind. Nothing here is
a measurement, and no number is compared with a bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.bench_scripts import load_bench

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)


def test_bench_env_workers_smoke(monkeypatch, tmp_path):
    module = load_bench("bench_env_workers", monkeypatch, tmp_path)
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
