"""benchmarks/bench_decode.py at its smallest size (``--tiny``: a random tiny model, batch 2, one round,
no vLLM): every section runs and its output has the fields RESULTS.md reads. Measures nothing."""

from __future__ import annotations

import json

import pytest

from helpers.bench_scripts import load_bench



def _bench(monkeypatch):
    return load_bench("bench_decode", monkeypatch)


def test_the_tiny_run_reports_every_field(monkeypatch, tmp_path):
    bench = _bench(monkeypatch)
    out = tmp_path / "bench_decode.json"
    result = bench.main(["--tiny", "--profile", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["decode_steps"] == json.loads(json.dumps(result["decode_steps"]))
    assert set(saved["machine"]["cpu_flags"]) == {"AVX2", "AVX-512", "AVX512-BF16", "AMX-BF16"}
    assert saved["limits"]["read_bytes_per_s"] > 0 and set(saved["limits"]["gemm_flops"]) == {"fp32", "bf16"}
    assert saved["weights"] > 0 and saved["weight_bytes"] == 4 * saved["weights"]  # fp32
    rows = saved["decode_steps"]
    assert [r["decoder"] for r in rows] == ["before", "forward", "loop_unpacked", "loop", "loop@1", "loop_bf16"]
    for r in rows:
        assert r["batch"] == 2 and r["n"] == 1 and r["bound"] in ("bandwidth", "gemm")
        assert r["ms_per_step"] > 0 and r["tok_per_s"] > 0 and r["of_limit"] > 0 and r["cpu_per_wall"] > 0
        assert r["limit_ms"] == pytest.approx(r["of_limit"] * r["ms_per_step"], rel=1e-9)
    assert [(s["batch"], s["vocab"]) for s in saved["sampler"]] == [(2, 49152), (2, 151936)]
    assert saved["sampler"][0]["of_loop_step"] > 0 and saved["vllm"] == []
    assert set(saved["profiles"]) == {"B=2 before", "B=2 loop_unpacked", "B=2 loop"}
    assert all(p["ops_per_layer"] > 0 and p["self_cpu_ms_per_step"] > 0 for p in saved["profiles"].values())


def test_five_rounds_are_the_least_outside_the_tiny_size(monkeypatch):
    bench = _bench(monkeypatch)
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "3"])
