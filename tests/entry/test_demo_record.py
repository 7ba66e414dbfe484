"""README's demo table is the recorded demo summary (docs/demo_summary.json, arlopti/entry/demo_record.py)."""

from __future__ import annotations

import json

from arlopti.entry.demo_record import README, RECORD, readme_table, record_from_summary, render_table


def test_readme_table_is_generated_from_the_recorded_demo():
    rec = json.loads(RECORD.read_text())
    assert rec["command"] == "python train.py experiment=kk_lopti_demo"
    assert readme_table(README.read_text()) == render_table(rec), (
        "README's demo table differs from docs/demo_summary.json: python -m arlopti.entry.demo_record record <summary.json>")


def test_record_from_a_summary_by_hand():
    summary = {"rollout_steps": 8, "optimizer_steps": 15,
               "start": {"reward/mean": -1.94, "reward/format_ok": 0.25, "reward/accuracy": 0.0,
                         "rollout/response_len_mean": 80.0},
               "end": {"reward/mean": -0.23, "reward/format_ok": 0.9, "reward/accuracy": 0.1,
                       "rollout/response_len_mean": 40.0},
               "eval_first": {"rollout_step": 0, "val/kk/kk_2ppl/greedy/acc": 0.125, "val/kk/kk_3ppl/greedy/acc": 0.0,
                              "val/kk/mean/greedy/acc": 0.0625, "val/kk/mean/greedy/reward": -2.0,
                              "val/kk/mean/greedy/format_rate": 0.2, "val/kk/mean/sampling/acc": 0.5},
               "eval_last": {"rollout_step": 8, "val/kk/kk_2ppl/greedy/acc": 0.25, "val/kk/kk_3ppl/greedy/acc": 0.0,
                             "val/kk/mean/greedy/acc": 0.125, "val/kk/mean/greedy/reward": 0.1,
                             "val/kk/mean/greedy/format_rate": 1.0}}
    table = render_table(record_from_summary(summary, "1 min"))
    assert "| train reward (3 correct, −3 no format) | −1.94 | −0.23 |" in table
    assert "| accuracy (mean; 2 / 3 people) | 0.062 (0.125 / 0.000) | 0.125 (0.250 / 0.000) |" in table
    assert "| **validation, greedy** | before GRPO | after 8 steps |" in table


def test_the_time_line_names_the_phases_and_the_machine_and_scales_the_total():
    rec = {"phase_seconds": {"start_up": 20.0, "cold_start": 60.0, "evaluations": 30.0, "rollout": 90.0,
                             "update": 100.0, "other": 10.0, "total": 310.0},
           "machine": {"cpu": "AMD EPYC", "cores": 2, "gemm_fp32_gflops": 90.0}}
    from arlopti.entry.demo_record import time_line

    line = time_line(rec)
    assert "start-up 20 s, cold start 60 s, 2 greedy evaluations 30 s, rollout 90 s, update 100 s, other 10 s" in line
    assert "fp32 GEMM 90 GFLOP/s; scaled to 180 GFLOP/s the run takes 2.6 min." in line  # 310 s x 90 / 180
    assert time_line({}) == ""
