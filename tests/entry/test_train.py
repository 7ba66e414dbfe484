"""End-to-end: every experiment composes and runs one rollout step; the smoke CLI writes TensorBoard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO_ROOT
from helpers.compose import compose_train

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

EXPERIMENTS = sorted(p.stem for p in (REPO_ROOT / "configs" / "experiment").glob("*.yaml"))
# The demo runs SmolLM2 for minutes; `debug=smoke` swaps in the tiny model, so it is as cheap as the rest.


def write_orz(tmp_path: Path) -> Path:
    """A tiny ORZ-format file (the real 57k set is not available offline), prepared like a user would."""
    from arlopti.data.prepare import main as prepare

    rows = [[{"from": "human", "value": f"What is {i} + {i}?"},
             {"from": "assistant", "ground_truth": {"value": str(2 * i)}}] for i in range(16)]
    src = tmp_path / "orz_math_57k_collected.json"
    src.write_text(json.dumps(rows))
    out = tmp_path / "orz" / "train.jsonl"
    assert prepare(["orz", "--input", str(src), "--output", str(out)]) == 0
    return out


def needs_shared(name: str) -> list[str]:
    """Skip what cannot run without ../shared; K&K experiments fall back to generated puzzles
    (the same experiment, algorithm and sizes; only the data differ)."""
    if name.startswith("kk_feedback") and not (FIXTURES / "kk").exists():  # reads the official prompt files
        pytest.skip(f"{name} reads the official K&K prompts in {FIXTURES / 'kk'}, which are absent")
    if name.startswith("kk_") and name != "kk_lopti_demo" and not (FIXTURES / "kk").exists():
        return ["data=kk_generated"]
    if name.startswith(("dsr_", "math_tool")) and not (FIXTURES / "math").exists():
        pytest.skip(f"{name} trains on DSR-Uniform in {FIXTURES / 'math'}, which is absent")
    if name.startswith("orz_") and not (FIXTURES / "math").exists():
        pytest.skip(f"{name} validates on the math benchmarks in {FIXTURES / 'math'}, which are absent")
    return []


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_one_step(name, tmp_path, monkeypatch):
    from arlopti.entry.train import train

    if name == "math_tool_qwen":  # TRL's tool contract needs a template that shows the tools (Qwen2.5's layout)
        from helpers.turns import TOOL_TEMPLATE

        monkeypatch.setattr("arlopti.models.loading.CHATML_TEMPLATE", TOOL_TEMPLATE)

    overrides = [f"experiment={name}", "debug=smoke", "rollout_steps=1", "callbacks.benchmark_eval.limit=1",
                 "logger=none", *needs_shared(name)]
    if name.startswith("orz_"):
        overrides.append(f"data.train_file={write_orz(tmp_path)}")
    if name.startswith(("dsr_", "orz_")):
        overrides.append("data.val_limit=2")
    cfg = compose_train(overrides, tmp_path)
    if "train_count_per_n" in cfg.data:  # K&K: one step needs a few puzzles, not the 4,500 of the file
        cfg = compose_train([*overrides, "data.train_count_per_n=4", "data.val_count_per_n=1"], tmp_path)
    out = train(cfg)
    module = out["module"]
    assert module.rollout_step == 1
    assert out["trainer"].global_step >= 1
    expected_phases = 2 if cfg.algorithm.lopti.enabled else 0  # per-phase tags exist where phases do
    assert sum(k.endswith("/skipped_empty") for k in module.last_step_context.metrics) == expected_phases


TB_SCALARS = [
    "reward/mean", "reward/std", "reward/accuracy", "reward/format_ok", "reward/zero_std_group_frac",
    "rollout/response_len_mean", "rollout/response_len_max", "rollout/truncated_frac",
    "update/lr", "lopti/low_frac", "lopti/high_frac", "ar/weight_mean",
    "timing/rollout_s", "timing/scoring_s", "timing/logprobs_s", "timing/update_s", "timing/tokens_per_s",
    "val/kk/mean/greedy/acc", "val/kk/mean/sampling/acc",
]
# Per-phase update metrics; a random model's tokens all fall in one phase, so check the phase that ran.
PHASE_SCALARS = ["pg_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high", "clip_frac_dual",
                 "ratio_mean", "ratio_max", "approx_kl", "grad_norm", "loss"]


def test_smoke_cli_writes_tensorboard(tmp_path):
    """`python train.py experiment=kk_ar_lopti debug=smoke` offline on CPU, then read the event file."""
    # Without the official K&K files, the same experiment on generated puzzles.
    data = [] if (FIXTURES / "kk").exists() else ["data=kk_generated"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ARLOPTI_SHARED": str(FIXTURES.parent)}
    proc = subprocess.run([sys.executable, "train.py", "experiment=kk_ar_lopti", "debug=smoke", *data,
                           f"hydra.run.dir={tmp_path}", "callbacks.benchmark_eval.limit=2"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, f"no event file under {tmp_path / 'tensorboard'}"
    acc = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    missing = [t for t in TB_SCALARS if t not in tags]
    assert not missing, f"missing scalars: {missing}"
    phase = "low" if "update/low/grad_norm" in tags else "high"
    missing = [f"update/{phase}/{t}" for t in PHASE_SCALARS if f"update/{phase}/{t}" not in tags]
    assert not missing, f"missing per-phase scalars: {missing}"
    missing = [f"update/{t}" for t in PHASE_SCALARS if f"update/{t}" not in tags]  # combined over phases
    assert not missing, f"missing combined update scalars: {missing}"
    assert "reward" not in tags and "epoch" not in tags and "rollout_step" not in tags  # no stray scalars
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]  # x-axis = rollout step
    assert "diag/token_prob_hist" in acc.Tags()["histograms"]
    assert any(t.startswith("samples/") for t in acc.Tags()["tensors"])  # completions as text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rollout_steps"] == 2
