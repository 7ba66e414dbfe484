"""benchmarks/bench_bf16_parity.py at its smallest size (``--model tiny``: a random tiny model, 2 cold-start
steps, 4-token responses; measures nothing): every part runs and writes the fields RESULTS.md reads, and the
variants' patches reach the code they stand for."""

from __future__ import annotations

import json
import math

from helpers.bench_scripts import load_bench



def _bench(monkeypatch, tmp_path):
    return load_bench("bench_bf16_parity", monkeypatch, tmp_path)


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def test_every_part_runs_and_writes_its_fields(monkeypatch, tmp_path):
    mod = _bench(monkeypatch, tmp_path)
    out = tmp_path / "parity.json"
    assert mod.main(["--model", "tiny", "--parts", "rates,step0,onestep,coldstart,grpo", "--rounds", "1",
                     "--seeds", "0,1", "--cold-steps", "2", "--grpo-tokens", "4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["command"] and data["machine"]["cpu_id"]
    rates = data["rates"]
    assert all(rates[k]["median"] > 0 for k in ("gemm_fp32_gflops", "gemm_bf16_gflops", "read_gbps", "bf16_over_fp32"))
    step0 = {r["variant"]: r for r in data["step0"]["rows"]}
    assert math.isclose(step0["fp32"]["cos_all"], 1.0, rel_tol=1e-9)
    assert all(-1 - 1e-9 <= r["cos_all"] <= 1 + 1e-9 and finite(r["loss"]) for r in step0.values())
    assert data["step0"]["dtypes"]["weights"] == ["torch.float32"] == data["step0"]["dtypes"]["grads"]
    assert all(finite(v) for v in data["onestep"].values())
    assert data["step0"]["dtypes"]["lightning_autocast_cache"] is False
    curves = data["coldstart"]["curves"]
    assert {(c["seed"], c["variant"]) for c in curves} == (
        {(0, v) for v in mod.VARIANTS} | {(1, "fp32"), (1, "bf16")})
    assert all(len(c["losses"]) == 2 and finite(*c["losses"]) for c in curves)
    grpo = data["grpo"]
    assert {r["variant"] for r in grpo["rows"]} == set(mod.VARIANTS) and set(grpo["buckets"]) == set(mod.VARIANTS) - {
        "fp32"}


def test_the_variants_patch_what_they_name(monkeypatch, tmp_path):
    mod = _bench(monkeypatch, tmp_path)
    import arlopti.learner.lifecycle as learner  # where the learner calls spread_master_weights

    real = learner.spread_master_weights
    with mod.variant_context("bf16-grid"):
        assert learner.spread_master_weights is not real
    for name in ("bf16", "fp32"):
        with mod.variant_context(name):
            assert learner.spread_master_weights is real
