"""benchmarks/async_model.py: the step-time formulas against hand-computed numbers (no vLLM, no GPU)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_model.py"
_spec = importlib.util.spec_from_file_location("async_model", PATH)
am = importlib.util.module_from_spec(_spec)
sys.modules["async_model"] = am  # dataclasses look the module up
_spec.loader.exec_module(am)


def test_synchronous_step_adds_every_phase():
    assert am.sync_step_s(7.0, 3.0, 0.5, 0.25) == pytest.approx(10.75)


def test_overlap_takes_the_longer_of_generation_and_update():
    assert am.overlapped_step_s(7.0, 3.0, 0.5, 0.25, k=1) == pytest.approx(7.75)  # generation-bound
    assert am.overlapped_step_s(2.0, 5.0, 1.0, k=1) == pytest.approx(6.0)  # update-bound
    assert am.overlapped_step_s(7.0, 3.0, 0.5, 0.25, k=2) == pytest.approx(7.75)  # k > 1: same steady state


def test_k0_is_the_synchronous_step_and_negative_k_is_refused():
    assert am.overlapped_step_s(7.0, 3.0, 0.5, 0.25, k=0) == pytest.approx(10.75)
    with pytest.raises(ValueError):
        am.overlapped_step_s(1.0, 1.0, 0.0, k=-1)


def test_scaling_and_transfer():
    assert am.scaled_s(210.0, 8, 4, 1.0) == pytest.approx(420.0)
    assert am.scaled_s(210.0, 8, 4, 0.5) == pytest.approx(210.0 * math.sqrt(2))
    assert am.scaled_s(210.0, 8, 4, 0.0) == pytest.approx(210.0)
    with pytest.raises(ValueError):
        am.scaled_s(1.0, 8, 0, 1.0)
    assert am.transfer_s(7.62e9, 2.0, 5.0) == pytest.approx(3.048)  # 15.24 GB at 5 GB/s


def test_gpu_rows_7b_on_4_plus_4():
    """T0 = 300 s, 70% generation: G8 = 210, U8 = 90; linear scaling doubles both on 4 GPUs."""
    rows = {(r["gen_exponent"], r["k"]): r for r in am.gpu_rows(am.GpuAssumptions())}
    assert rows[(None, 0)]["step_s"] == pytest.approx(300.0)
    assert rows[(1.0, 0)]["step_s"] == pytest.approx(420 + 180 + 3.048)
    assert rows[(1.0, 1)]["step_s"] == pytest.approx(423.048)
    assert rows[(1.0, 1)]["vs_colocated"] == pytest.approx(300 / 423.048)
    assert rows[(0.0, 1)]["vs_colocated"] == pytest.approx(300 / 213.048)  # latency-bound generation
    assert rows[(1.0, 1)]["steps_per_hour"] == pytest.approx(3600 / 423.048)


def test_best_split_balances_generation_and_update():
    """Linear scaling: 5 + 3 gives max(210*8/5, 90*8/3) = max(336, 240); 6 + 2 gives max(280, 360)."""
    n_gen, ratio = am.best_split(am.GpuAssumptions(), 1.0)
    assert n_gen == 5
    assert ratio == pytest.approx(300 / (336 + 3.048))


def test_cpu_rows_predict_from_the_k0_run():
    """k0: G 6, U 9 + 1, S 2, step 19 -> O = 1; k1 predicted max(6, 10) + 2 + 1 = 13; colocated 20 s."""
    bench = {"summary": [
        {"config": "colocated", "step_s": 20.0, "vs_colocated": 1.0},
        {"config": "server_k0", "step_s": 19.0, "rollout_s": 6.0, "update_s": 9.0, "logprobs_s": 1.0,
         "sync_s": 2.0, "vs_colocated": 20 / 19},
        {"config": "server_k1", "step_s": 12.0, "rollout_s": 0.0, "update_s": 9.0, "logprobs_s": 1.0,
         "sync_s": 2.0, "vs_colocated": 20 / 12},
    ]}
    rows = {r["config"]: r for r in am.cpu_rows(bench)}
    assert rows["server_k0"]["other_s"] == pytest.approx(1.0)
    assert rows["server_k0"]["predicted_step_s"] == pytest.approx(19.0)
    assert rows["server_k1"]["predicted_step_s"] == pytest.approx(13.0)
    assert rows["server_k1"]["predicted_vs_colocated"] == pytest.approx(20 / 13)
    assert rows["server_k1"]["measured_vs_colocated"] == pytest.approx(20 / 12)
    with pytest.raises(ValueError):
        am.cpu_rows({"summary": [bench["summary"][2]]})


def test_report_is_labelled_as_a_model():
    text = am.report(am.GpuAssumptions(), None)
    assert text.count(am.LABEL) >= 3 and "gb_per_s" in text and "gen_frac" in text


def test_fitted_exponent_inverts_the_scaling():
    assert am.fitted_exponent(420.0, 210.0, 4, 8) == pytest.approx(1.0)
    assert am.fitted_exponent(am.scaled_s(210.0, 8, 4, 0.5), 210.0, 4, 8) == pytest.approx(0.5)
    assert am.fitted_exponent(30.0, 20.0, 1, 2) == pytest.approx(math.log(1.5) / math.log(2))


def test_cpu_exponents_from_colocated_and_k0():
    """Generation 6 s on 1 core vs 4 s on 2; update 9 + 1 = 10 s vs 4 + 1 = 5 s (exponent 1)."""
    bench = {"summary": [
        {"config": "colocated", "step_s": 10.0, "rollout_s": 4.0, "update_s": 4.0, "logprobs_s": 1.0},
        {"config": "server_k0", "step_s": 19.0, "rollout_s": 6.0, "update_s": 9.0, "logprobs_s": 1.0, "sync_s": 2.0},
    ]}
    rows = {r["phase"]: r for r in am.cpu_exponents(bench)}
    assert rows["generation"]["exponent"] == pytest.approx(math.log(1.5) / math.log(2))
    assert rows["log-probs + update"]["exponent"] == pytest.approx(1.0)
