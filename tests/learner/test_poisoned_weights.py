"""Poisoned weights never go unnoticed (issue 14, row 2).

A step whose loss and gradient norm are finite can still leave non-finite weights (a huge learning
rate): the learner checks the weights after every optimizer step and aborts with
:class:`NonFiniteAbort` naming the rollout step, lr, loss and gradient norm, and no checkpoint with
a non-finite tensor is ever written (``save_atomic`` refuses; the previous ``last.ckpt`` stays).
In process on the tiny model, and once through ``python train.py ... optim.lr=1e30``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint, save_atomic
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.guard import tensors_finite
from arlopti.learner.module import GRPOModule, NonFiniteAbort
from arlopti.checkpoints.resume import CheckpointError
from helpers.toy import ToyDataModule, toy_trainer

REPO = Path(__file__).resolve().parents[2]


def make_cfg(lr: float = 1e-2) -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(),
                     sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     optim=OptimConfig(lr=lr), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))


def all_finite_checkpoints(folder: Path) -> list[Path]:
    """Every checkpoint file under ``folder``; asserts each tensor in it is finite."""
    found = sorted(p for p in folder.rglob("*.ckpt*") if p.is_file())
    for p in found:
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
        tensors = list(ckpt["state_dict"].values())
        for opt in ckpt.get("optimizer_states", []):
            tensors += [v for st in opt["state"].values() for v in st.values() if isinstance(v, torch.Tensor)]
        assert bool(tensors_finite(tensors)), f"{p} holds a non-finite tensor"
    return found


def test_tensors_finite():
    good = [torch.randn(4, 4), torch.full((3,), 1e30), torch.randn(2, dtype=torch.bfloat16), torch.empty(0)]
    assert bool(tensors_finite(good)) and bool(tensors_finite([]))
    for bad in (math.nan, math.inf, -math.inf):
        t = torch.randn(5, 5)
        t[2, 3] = bad
        assert not bool(tensors_finite([*good, t]))


def test_first_step_size_by_hand():
    """AdamW's first step moves each element with a gradient by lr g / (|g| + eps), plus lr wd w; SGD's by lr (g + wd w)."""
    from arlopti.learner.guard import first_step_size

    w = torch.nn.Parameter(torch.tensor([3.0, 4.0, 0.0]))
    w.grad = torch.tensor([2.0, -1e-3, 0.0])
    adam = torch.optim.AdamW([w], lr=0.1, eps=1e-8, weight_decay=0.5)
    step = 0.1 * (w.grad / (w.grad.abs() + 1e-8) + 0.5 * w.detach())
    assert first_step_size(adam) == pytest.approx((float(step.norm()), 5.0), rel=1e-6)
    before = w.detach().clone()
    adam.step()
    assert float((before - w.detach()).norm()) == pytest.approx(float(step.norm()), rel=1e-5), "torch agrees"
    sgd = torch.optim.SGD([w], lr=0.1, weight_decay=0.5)
    want = 0.1 * (w.grad + 0.5 * w.detach())
    assert first_step_size(sgd)[0] == pytest.approx(float(want.norm()), rel=1e-6)


@pytest.mark.parametrize("lr, warned", [(1e30, True), (1e-3, False)])
def test_a_first_step_larger_than_the_weights_warns(tiny_tokenizer, caplog, lr, warned):
    """Issue 38: optim.lr=1e30 ran to the end with weights near 1e28 and no word; now the first step warns."""
    from helpers.fixed_rollouts import FixedEngine

    module = GRPOModule(make_cfg(lr), tokenizer=tiny_tokenizer, total_rollout_steps=1)
    module.rollout_engine = FixedEngine(tiny_tokenizer)
    with caplog.at_level("WARNING", logger="arlopti.learner.guard"):
        toy_trainer().fit(module, datamodule=ToyDataModule(n=2, tokenizer=tiny_tokenizer, prompts_per_step=2,
                                                           max_prompt_length=256))
    found = [r.getMessage() for r in caplog.records if r.name == "arlopti.learner.guard"]
    assert bool(found) is warned, found
    if warned:
        assert len(found) == 1 and re.match(r"optim\.lr=1e\+30: the first optimizer step \(rollout step 1\) would "
                                            r"move the trainable weights by [\d.e+]+ .* x their own norm", found[0])


def poison_after(monkeypatch, n: int) -> None:
    """Make the optimizer step number ``n`` (1-based) write a NaN into the weights, its loss and
    gradient finite (what lr=inf or an optimizer overflow does)."""
    real = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self, *a, **k):
        out = real(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == n:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = math.nan
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)


def test_a_poisoned_step_aborts_before_any_save(tiny_tokenizer, tmp_path, monkeypatch):
    poison_after(monkeypatch, 2)  # rollout step 0 is clean and saved; step 1 poisons the weights
    module = GRPOModule(make_cfg(), tokenizer=tiny_tokenizer, total_rollout_steps=4)
    dm = ToyDataModule(n=8, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    ckpt = RolloutCheckpoint(str(tmp_path / "checkpoints"), every_n_steps=1)
    trainer = toy_trainer(callbacks=[ckpt], enable_checkpointing=True)
    with pytest.raises(NonFiniteAbort, match=r"optimizer step at rollout step 1 made the weights non-finite.*"
                                             r"lr=0\.01, loss=.*grad_norm=\d"):
        trainer.fit(module, datamodule=dm)
    saved = all_finite_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in saved] == ["last.ckpt"]
    assert torch.load(saved[0], weights_only=False)["arlopti"]["rollout_step"] == 1


def test_save_refuses_a_non_finite_state_and_keeps_the_last_good_one(tiny_tokenizer, tmp_path):
    module = GRPOModule(make_cfg(), tokenizer=tiny_tokenizer, total_rollout_steps=1)
    dm = ToyDataModule(n=4, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    ckpt = RolloutCheckpoint(str(tmp_path / "checkpoints"), every_n_steps=1)
    trainer = toy_trainer(callbacks=[ckpt], enable_checkpointing=True)
    trainer.fit(module, datamodule=dm)
    last = tmp_path / "checkpoints" / "last.ckpt"
    good = last.read_bytes()
    # a NaN in the optimizer state (the weights themselves finite)
    state = next(iter(trainer.optimizers[0].state.values()))
    state["exp_avg_sq"].view(-1)[0] = math.inf
    with pytest.raises(CheckpointError, match=r"refusing to save .*last.ckpt: .*non-finite.*optimizer 0 state 0 "
                                              r"exp_avg_sq"):
        save_atomic(trainer, last)
    state["exp_avg_sq"].view(-1)[0] = 0.0
    next(module.policy.parameters()).data.view(-1)[0] = math.nan
    with pytest.raises(CheckpointError, match=r"non-finite.*policy\."):
        save_atomic(trainer, last)
    assert last.read_bytes() == good and not last.with_name("last.ckpt.tmp").exists()
    assert all_finite_checkpoints(tmp_path / "checkpoints") == [last]


# Loaded by the subprocess (PYTHONPATH): AdamW's 3rd step writes +inf into a weight, its loss and
# gradient finite - what lr=inf or an optimizer overflow does, which no finite lr reproduces in fp32
# (lr/(1-beta1) > float32's max is a RuntimeError in torch; below it the weights stay finite).
POISON = """
import math, torch
_real = torch.optim.AdamW.step
_n = [0]
def _step(self, *a, **k):
    out = _real(self, *a, **k)
    _n[0] += 1
    if _n[0] == 3:
        with torch.no_grad():
            self.param_groups[0]["params"][0].view(-1)[0] = math.inf
    return out
torch.optim.AdamW.step = _step
"""


def train_py(tmp_path: Path, name: str, *overrides: str, env: dict | None = None) -> tuple[int, str]:
    cmd = [sys.executable, "train.py", "experiment=kk_lopti", "debug=smoke", "data=kk_generated", "rollout_steps=3",
           "callbacks.model_checkpoint.every_n_steps=1", f"paths.log_dir={tmp_path}/{name}", "logger=none",
           "~callbacks.benchmark_eval", "~callbacks.rich_progress_bar", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_train_py_with_poisoned_weights_exits_non_zero_with_only_finite_checkpoints(tmp_path):
    """The issue's repro through ``python train.py``: weights poisoned by a step with a finite loss
    and gradient (old code: the run saved them, then skipped or crashed); then a huge finite lr."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(POISON)
    path = os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")])
    rc, out = train_py(tmp_path, "poisoned", env={"PYTHONPATH": path})
    assert rc != 0, out[-3000:]
    assert "NonFiniteAbort" in out and "made the weights non-finite" in out, out[-3000:]
    assert re.search(r"at rollout step \d+ .*\(lr=[\d.e+-]+, loss=\S+, grad_norm=\S+\)", out), out[-3000:]
    all_finite_checkpoints(tmp_path / "poisoned")

    rc, out = train_py(tmp_path, "huge_lr", "optim.lr=1e30")  # weights near 1e30: the next steps' skip guard
    assert rc != 0, out[-3000:]
    assert "NonFiniteAbort" in out, out[-3000:]
    all_finite_checkpoints(tmp_path / "huge_lr")
