"""benchmarks/gpu_check_scale.py (the real-size part of gpu_check.sh) on the CPU: its arguments, the
config files it carries, and the fields of its report, from a ``--dry-run`` at a tiny size. No GPU, and
no number here is a measurement."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


@pytest.fixture()
def scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # memory_plan, gpu_check_args: beside the script
    spec = importlib.util.spec_from_file_location("gpu_check_scale", BENCH / "gpu_check_scale.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check_scale", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "qwen2.5-7b"], "--sizes: unknown"),
    (["--decode-batches", "16,x"], "--decode-batches"),
    (["--micro", "3"], "--micro must divide"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--dry-run", "--sizes", "qwen2.5-3b"], "--sizes: unknown")])
def test_bad_arguments_are_refused_naming_the_option(scale, capsys, argv, message):
    with pytest.raises(SystemExit):
        scale.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_defaults_are_the_real_sizes_and_the_dry_run_shrinks_everything(scale):
    real = scale.parse_args([])
    assert real.sizes == ["qwen2.5-1.5b", "qwen2.5-3b"] and real.length == 1024 and real.steps == 5
    assert real.decode_batches == [16, 64] and real.gemm == 8192 and real.budget_s == 170.0
    dry = scale.parse_args(["--dry-run"])
    assert dry.sizes == ["tiny-a", "tiny-b"] and dry.length <= 8 and dry.steps == 1 and dry.gemm == 256


def test_the_carried_configs_are_small_and_build_the_published_parameter_counts(scale, tmp_path):
    paths = scale.export_configs(tmp_path)
    assert [p.parent.name for p in paths] == ["qwen2.5-1.5b", "qwen2.5-3b"]
    assert sum(p.stat().st_size for p in paths) < 64 * 1024
    got = scale.check_configs(tmp_path)
    assert round(got["qwen2.5-1.5b"]["params"] / 1e9, 2) == 1.54  # Qwen2.5-1.5B: 1.54 B (its model card)
    assert round(got["qwen2.5-3b"]["params"] / 1e9, 2) == 3.09
    cfg = json.loads(paths[1].read_text())
    cfg["intermediate_size"] = 8960
    paths[1].write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"qwen2.5-3b/config.json is not the Qwen2.5-3B-Instruct shape"):
        scale.check_configs(tmp_path)
    script = (BENCH / "gpu_check.sh").read_text()
    assert '--export-configs "$CARRY/configs"' in script and '--configs "$CARRY/configs"' in script


def test_model_flops_count_by_hand(scale):
    """bench_mfu's count on a 2-layer shape: 6 N_body T + 6 V H T_resp + 12 L H sum S^2; the recompute one more
    forward of the body and the attention."""
    shape = scale.DRY_SIZES["tiny-a"]
    n_body = 2 * shape.layer_params + 64
    f = scale.model_flops(shape, rows=4, prompt_len=10, length=6)
    assert f["model"] == 6 * n_body * 64 + 6 * 512 * 64 * 24 + 12 * 2 * 64 * 4 * 16**2
    assert f["recompute"] == 2 * n_body * 64 + 4 * 2 * 64 * 4 * 16**2


@pytest.mark.slow
def test_the_dry_run_reports_every_field(scale, tmp_path):
    configs = tmp_path / "configs"
    scale.export_configs(configs)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check_scale.py"), "--dry-run", "--sizes", "tiny-a",
                           "--configs", str(configs), "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("GPU CHECK SCALE: PASS")
    report = json.loads((tmp_path / "gpu_check_scale.json").read_text())
    assert report["ok"] and report["dry_run"] and set(report["configs"]) == {"qwen2.5-1.5b", "qwen2.5-3b"}
    assert report["peaks"]["bf16_gemm_tflops"] > 0 and report["peaks"]["hbm_read_gb_per_s"] > 0
    stages = report["stages"]
    assert {k: v["status"] for k, v in stages.items()} == {
        k: "PASS" for k in ("peaks", "configs", "tiny-a/grpo", "tiny-a/engine_copy", "tiny-a/sync", "tiny-a/decode_b2",
                            "tiny-a/lopti")}
    size = report["sizes"]["tiny-a"]
    grpo, lopti = size["grpo"], size["lopti"]
    for key in ("update_s_median", "logprobs_s_median", "phase_s_median", "model_tflop", "achieved_tflops", "mfu",
                "hfu"):
        assert math.isfinite(grpo[key]) and grpo[key] > 0, key
    assert grpo["hfu"] > grpo["mfu"] and isinstance(grpo["mfu_goal_0.40_met"], bool) and grpo["n"] == 1
    assert lopti["optimizer_steps_per_rollout"] == 2 * grpo["optimizer_steps_per_rollout"] == 2  # two phases
    assert 0 < lopti["low_token_frac"] < 1  # eta = 1/V splits a random model's tokens
    assert size["lopti_over_grpo"]["update"] > 0 and size["lopti_over_grpo"]["update_phase"] > 0
    assert size["memory"]["peak_allocated_gb"] is None and size["memory"]["predicted_gb"] > 0  # no CUDA here
    assert size["sync"]["tensors"] > 0 and 0 < size["sync"]["share_of_step"] < 1
    [decode] = size["decode"]
    assert decode["batch"] == 2 and decode["new_tokens"] == 4 and decode["tok_per_s"] > 0
    assert decode["of_limit"] == pytest.approx(decode["limit_ms_per_step"] / decode["ms_per_step"])
    assert size["workload"]["responses"] == 4 and size["params"] == scale.DRY_SIZES["tiny-a"].params
