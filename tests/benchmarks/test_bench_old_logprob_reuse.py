"""benchmarks/bench_old_logprob_reuse.py at its smallest size (``--smoke``: hidden 32 x 1 layer, 2 prompts x 4,
8 tokens, one round of one step): every configuration runs and the JSON has the fields RESULTS.md reads.
Measures nothing: no time is compared with a bound."""

from __future__ import annotations

import json
import math

from helpers.bench_scripts import load_bench

SHAPES = {"grpo_1mb", "lopti_1mb", "grpo_4mb"}


def _bench(monkeypatch, tmp_path):
    return load_bench("bench_old_logprob_reuse", monkeypatch, tmp_path)


def test_the_smoke_run_reports_every_field(monkeypatch, tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "reuse.json"
    try:
        assert _bench(monkeypatch, tmp_path).main(["--smoke", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    data = json.loads(out.read_text())
    assert data["command"] and data["machine"]["cpu"] and data["smoke"] is True
    for when in ("before", "after"):
        assert set(data["rates"][when]) == {"gemm_fp32_gflops", "read_gb_s"}
        assert all(v > 0 for v in data["rates"][when].values())
    assert set(data["summary"]) == {f"{s}_{r}" for s in SHAPES for r in ("on", "off")}
    for name, row in data["summary"].items():
        assert row["update_s"]["n"] == 1 and len(row["fit_medians_s"]) == 1
        assert row["old_logprobs_reused_frac"] > 0 if name.endswith("_on") else row["old_logprobs_reused_frac"] == 0
    assert data["summary"]["grpo_1mb_on"]["old_logprobs_reused_frac"] == 1.0
    assert data["summary"]["grpo_4mb_on"]["old_logprobs_reused_frac"] == 0.25  # the first of 4 mini-batches
    assert data["summary"]["lopti_1mb_on"]["optimizer_steps_per_rollout"] == 2
    assert set(data["ratios"]) == SHAPES
    for r in data["ratios"].values():
        assert r["n"] == 1 and len(r["per_round"]) == 1 and math.isfinite(r["median"]) and r["median"] > 0
        assert r["same_batches"] is True and math.isfinite(r["weights_max_abs_diff"]) and r["weights_max_abs_change"] > 0
