"""RolloutCheckpoint, exact resume, preemption, and the checks on bad checkpoints.

In-process (tiny model, toy task, the real HF engine):

* resume is exact: 4 rollout steps in one go, or 2 (stopping on an epoch's last batch) + resume
  + 2, give identical metrics, data order, global-RNG draws and final parameters; the rollout
  seeds need nothing but the restored ``rollout_step``;
* the final save (when ``rollout_steps`` stops a run mid-epoch) lets a resume finish the epoch;
* a SIGTERM during a step: the step finishes, ``last.ckpt`` is written, training stops;
* top-k by a monitored metric keeps the k best files;
* a config mismatch, and weights of another model (truncated files and shards and the
  ``ckpt_path`` resolution are in tests/checkpoints/test_resume.py);
* integrity: bytes flipped in ``last.ckpt``'s ``exp_avg_sq`` are named (file, zip entry, tensor),
  ``ckpt_path=last`` falls back to the kept ``last.ckpt.old`` and the resumed run replaces the
  damaged file; a save that fails its verification replaces nothing (non-finite states:
  tests/learner/test_poisoned_weights.py).

Through ``python train.py`` subprocesses (``slow``): SIGTERM exits with status 0 after saving,
``kill -9`` during a step loses only the steps since the last checkpoint, and the resumed runs
continue to the requested step count.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.checkpoints.resume import config_mismatches, load_checkpoint_metadata
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from helpers.moved import assert_moved, snapshot
from helpers.toy import ToyDataModule, toy_trainer
from helpers.zip_bytes import flip_entry_bytes

REPO = Path(__file__).resolve().parents[2]


def make_cfg() -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(),
                     sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))


class Recorder(L.Callback):
    """Per-step metrics (timings dropped) and one draw from each global RNG; ``before``: the policy's
    parameters when the module was built (a fresh run's starting point, for :func:`assert_moved`)."""

    def __init__(self):
        self.rows = []
        self.before = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = {k: v for k, v in pl_module.last_step_context.metrics.items() if not k.startswith("timing/")}
        m.update(step=pl_module.rollout_step, epoch=trainer.current_epoch, uids=list(batch.uids),
                 rng=(float(torch.rand(())), float(np.random.rand()), random.random()))
        self.rows.append(m)


def run(tok, steps, ckpt_dir, ckpt_path=None, callbacks=(), every=1, epochs=2):
    L.seed_everything(7, verbose=False)
    module = GRPOModule(make_cfg(), tokenizer=tok, total_rollout_steps=steps)
    dm = ToyDataModule(n=4, tokenizer=tok, prompts_per_step=2, max_prompt_length=256)  # 2 steps per epoch
    rec = Recorder()
    rec.before = snapshot(module.policy)
    ckpt = RolloutCheckpoint(str(ckpt_dir), every_n_steps=every)
    trainer = toy_trainer(callbacks=[rec, ckpt, *callbacks], enable_checkpointing=True, max_epochs=epochs)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, rec, ckpt


def params(module):
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_resume_is_exact(tiny_tokenizer, tmp_path):
    """4 steps in one go = 2 steps, stop (on an epoch's last batch), resume, 2 more (mid-epoch
    stops are covered by the next test and by the FSDP2 test in tests/distributed)."""
    full, rec_full, _ = run(tiny_tokenizer, 4, tmp_path / "a")
    assert [r["epoch"] for r in rec_full.rows] == [0, 0, 1, 1]
    part, rec1, _ = run(tiny_tokenizer, 2, tmp_path / "b")
    last = tmp_path / "b" / "last.ckpt"
    assert load_checkpoint_metadata(last)["arlopti"]["rollout_step"] == 2
    resumed, rec2, _ = run(tiny_tokenizer, 4, tmp_path / "b", ckpt_path=str(last))
    rows = rec1.rows + rec2.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the toy reward varies inside each group: a real gradient at every step, so the comparison can fail
    assert all(r["reward/zero_std_group_frac"] < 1 for r in rows)
    print(assert_moved(rec_full.before, full.policy, full.trainer.optimizers[0], what="4 steps in one go"))
    print(assert_moved(params(part), resumed.policy, resumed.trainer.optimizers[0], what="steps 3-4 after the resume"))
    for a, b in zip(rec_full.rows, rows):
        diff = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
        assert not diff, f"step {a['step']} differs after resume: {diff}"
    pa, pb = params(full), params(resumed)
    worst = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    print(f"resume: max |param(4) - param(2+2)| = {worst}; step-3/4 metrics (loss, reward, grad norm, ...), "
          "data order and RNG draws identical")
    assert worst == 0.0
    assert resumed.trainer.global_step == full.trainer.global_step == 4


def test_the_final_save_lets_a_resume_finish_the_epoch(tiny_tokenizer, tmp_path):
    # No periodic save: last.ckpt is written when rollout_steps stops the run mid-epoch. A save in
    # on_train_end would record the epoch as finished and the resumed run would train nothing.
    _, first, _ = run(tiny_tokenizer, 1, tmp_path, every=None, epochs=1)
    _, rest, _ = run(tiny_tokenizer, 2, tmp_path, ckpt_path=str(tmp_path / "last.ckpt"), every=None, epochs=1)
    assert [r["step"] for r in first.rows + rest.rows] == [1, 2]
    assert len({u for r in first.rows + rest.rows for u in r["uids"]}) == 4  # the whole epoch, once


def test_sigterm_finishes_the_step_saves_and_stops(tiny_tokenizer, tmp_path):
    class SendSigterm(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.rollout_step == 0:  # during step 1
                os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    module, rec, ckpt = run(tiny_tokenizer, 4, tmp_path, callbacks=[SendSigterm()], every=None)
    assert module.rollout_step == 1 and ckpt.preempted and module.preempted
    assert load_checkpoint_metadata(tmp_path / "last.ckpt")["arlopti"]["rollout_step"] == 1
    assert json.loads((tmp_path / "PREEMPTED").read_text()) == {"rollout_step": 1, "signal": "SIGTERM"}
    assert signal.getsignal(signal.SIGTERM) == before, "the handler must be removed after training"
    resumed, rec2, _ = run(tiny_tokenizer, 2, tmp_path, ckpt_path=str(tmp_path / "last.ckpt"), every=None)
    assert [r["step"] for r in rec2.rows] == [2]
    assert not (tmp_path / "PREEMPTED").exists(), "a run that finishes removes the note"


def test_top_k_keeps_the_best_by_the_monitored_metric(tiny_tokenizer, tmp_path):
    values = iter([0.5, 0.3, 0.7])

    class Publish(L.Callback):  # stands in for the eval callback
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.callback_metrics["val/kk/mean/greedy/acc"] = torch.tensor(next(values))

    L.seed_everything(7, verbose=False)
    module = GRPOModule(make_cfg(), tokenizer=tiny_tokenizer, total_rollout_steps=3)
    dm = ToyDataModule(n=8, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    ckpt = RolloutCheckpoint(str(tmp_path), every_n_steps=None, monitor="val/kk/mean/greedy/acc", save_top_k=2)
    toy_trainer(callbacks=[Publish(), ckpt], enable_checkpointing=True).fit(module, datamodule=dm)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["last.ckpt", "step=000001-val_kk_mean_greedy_acc=0.5000.ckpt",
                     "step=000003-val_kk_mean_greedy_acc=0.7000.ckpt"]
    assert [round(s, 4) for s, _ in ckpt.best] == [0.7, 0.5]
    state = load_checkpoint_metadata(tmp_path / "last.ckpt")["callbacks"]["RolloutCheckpoint"]
    assert [round(s, 4) for s, _ in state["best"]] == [0.7, 0.5]


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match="model_checkpoint.mode"):
        RolloutCheckpoint("x", mode="best")
    with pytest.raises(ValueError, match="model_checkpoint.every_n_steps"):
        RolloutCheckpoint("x", every_n_steps=0)
    with pytest.raises(ValueError, match="unknown signal 'SIGNOPE'"):
        RolloutCheckpoint("x", signals=["SIGNOPE"])


# ---------------------------------------------------------------------------------------------
# checkpoints of another config
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_ckpt(tiny_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    run(tiny_tokenizer, 1, d)
    return d / "last.ckpt"


def test_config_mismatch_lists_keys_and_the_override(saved_ckpt):
    from dataclasses import replace

    from arlopti.config import ConfigError, ModelConfig, TinyModelConfig
    from arlopti.checkpoints.resume import check_resume_compatible

    cfg = make_cfg()
    check_resume_compatible(str(saved_ckpt), cfg)  # the same config passes
    other = replace(cfg, model=ModelConfig(tiny=TinyModelConfig(hidden_size=32)), optim=OptimConfig(lr=5e-3))
    with pytest.raises(ConfigError) as err:
        check_resume_compatible(str(saved_ckpt), other)
    msg = str(err.value)
    assert "model.tiny.hidden_size: checkpoint 64, this run 32" in msg and "optim.lr: checkpoint 0.01" in msg
    assert "allow_config_mismatch=true" in msg
    check_resume_compatible(str(saved_ckpt), other, allow_mismatch=True)  # warns only
    assert config_mismatches({"a": {"b": (1, 2)}}, {"a": {"b": [1, 2]}}) == []


def test_loading_weights_of_another_model_is_refused(saved_ckpt, tiny_tokenizer):
    from arlopti.config import ConfigError, ModelConfig, TinyModelConfig

    cfg = make_cfg()
    cfg.model = ModelConfig(tiny=TinyModelConfig(hidden_size=32, intermediate_size=64))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer)
    with pytest.raises(ConfigError, match="shape mismatch.*different model"):
        module.on_load_checkpoint(torch.load(saved_ckpt, weights_only=False))


def test_ctrl_c_mid_step_saves_and_the_resumed_run_is_bit_exact(tiny_tokenizer, tmp_path, caplog):
    """SIGINT (Ctrl-C) during step 2 of 4: the step finishes, last.ckpt is written, the resume
    command is logged, training stops; resuming gives the uninterrupted run's steps 3-4 (metrics,
    data order, RNG draws) and its final parameters bit for bit (issue 24, §2)."""
    import logging

    class CtrlC(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.rollout_step == 1:  # during step 2
                os.kill(os.getpid(), signal.SIGINT)

    full, rec_full, _ = run(tiny_tokenizer, 4, tmp_path / "full")
    before = signal.getsignal(signal.SIGINT)
    with caplog.at_level(logging.WARNING, logger="arlopti.callbacks.checkpointing"):
        part, rec1, ckpt = run(tiny_tokenizer, 4, tmp_path / "cut", callbacks=[CtrlC()], every=None)
    last = tmp_path / "cut" / "last.ckpt"
    assert part.rollout_step == 2 and ckpt.preempted
    assert json.loads((tmp_path / "cut" / "PREEMPTED").read_text()) == {"rollout_step": 2, "signal": "SIGINT"}
    assert f"stopped by SIGINT after rollout step 2. Resume with the same command plus ckpt_path={last}" in caplog.text
    assert signal.getsignal(signal.SIGINT) == before, "Ctrl-C must behave as usual again after training"
    resumed, rec2, _ = run(tiny_tokenizer, 4, tmp_path / "cut", ckpt_path=str(last), every=None)
    rows = rec1.rows + rec2.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["reward/zero_std_group_frac"] < 1 for r in rows)
    print(assert_moved(params(part), resumed.policy, resumed.trainer.optimizers[0], what="steps 3-4 after Ctrl-C"))
    for a, b in zip(rec_full.rows, rows):
        assert a == b, f"step {a['step']} differs after the Ctrl-C resume"
    pa, pb = params(full), params(resumed)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_a_second_ctrl_c_stops_at_once(tmp_path, monkeypatch):
    """The first SIGINT only sets the flag; the second restores the default action and re-sends
    the signal to this process (which then dies at once; os.kill is intercepted here)."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    ckpt = RolloutCheckpoint(str(tmp_path))
    assert signal.SIGINT in ckpt.signals
    before = signal.getsignal(signal.SIGINT)
    try:
        ckpt._on_signal(signal.SIGINT, None)
        assert ckpt._received == signal.SIGINT and sent == []
        ckpt._on_signal(signal.SIGINT, None)
        assert sent == [(os.getpid(), signal.SIGINT)] and signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------------------------------------
# real processes: SIGTERM and kill -9
# ---------------------------------------------------------------------------------------------


def start_train(tmp_path: Path, run: str, *overrides: str) -> subprocess.Popen:
    """``python train.py`` on K&K from the generator (offline), 6 rollout steps, a checkpoint every step."""
    cmd = [sys.executable, "train.py", "debug=smoke", "data=kk_generated", "data.train_count_per_n=8",
           "data.val_count_per_n=1", "rollout_steps=6", "~callbacks.benchmark_eval", "~callbacks.rich_progress_bar",
           "logger=none", "callbacks.model_checkpoint.every_n_steps=1", f"paths.log_dir={tmp_path}/logs",
           f"hydra.run.dir={tmp_path}/logs/train/s42_smoke/{run}", *overrides]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(proc: subprocess.Popen, pattern: str, timeout: float = 240) -> tuple[re.Match, str]:
    """Read ``proc``'s output until a line matches ``pattern``; returns (match, output so far)."""
    seen, deadline = [], time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m, "".join(seen)
        if time.time() > deadline:
            break
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r}; output:\n{''.join(seen)[-4000:]}")


def ckpt_step(path: Path) -> int:
    return int(load_checkpoint_metadata(path)["arlopti"]["rollout_step"])


@pytest.mark.slow
def test_sigterm_exits_cleanly_and_kill_9_loses_only_uncheckpointed_steps(tmp_path):
    # 1. SIGTERM after the first checkpoint: the step finishes, last.ckpt is written, exit status 0
    proc = start_train(tmp_path, "run1")
    wait_for(proc, r"saved checkpoint .* at rollout step 1 ")
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "preemption signal" in out
    last1 = tmp_path / "logs/train/s42_smoke/run1/checkpoints" / "last.ckpt"
    s1 = ckpt_step(last1)
    assert 1 <= s1 < 6
    assert json.loads((last1.parent / "PREEMPTED").read_text())["rollout_step"] == s1

    # 2. resume (ckpt_path=last finds run1's last.ckpt: same task, newest), then kill -9 mid-run
    proc = start_train(tmp_path, "run2", "ckpt_path=last")
    m, out = wait_for(proc, r"saved checkpoint .* at rollout step (\d+) ")
    assert f"resuming from {last1}" in out
    logged = int(m.group(1))
    assert logged == s1 + 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    last2 = tmp_path / "logs/train/s42_smoke/run2/checkpoints" / "last.ckpt"
    s2 = ckpt_step(last2) if last2.exists() else ckpt_step(last2.with_name("last.ckpt.old"))
    assert s2 in (logged, logged + 1), "the newest complete checkpoint is the last one saved before the kill"

    # 3. resume again: it continues from s2 and reaches 6 rollout steps
    proc = start_train(tmp_path, "run3", "ckpt_path=last")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "resuming from" in out and "run2/checkpoints/last.ckpt" in out
    saved = [int(x) for x in re.findall(r"saved checkpoint .* at rollout step (\d+) ", out)]
    assert saved == list(range(s2 + 1, 7)), f"lost or repeated steps: resumed at {s2}, saved {saved}"
    print(f"SIGTERM: exit 0 with last.ckpt at step {s1}; kill -9 after the step-{logged} save: newest complete "
          f"checkpoint step {s2}; the resumed run saved steps {saved}")
    assert ckpt_step(tmp_path / "logs/train/s42_smoke/run3/checkpoints" / "last.ckpt") == 6


# ---- integrity (issue 14, row 3) ----------------------------------------------------------------------------------


def flip_tensor_blob(path: Path, tensor: torch.Tensor, n: int = 400) -> str:
    """Invert ``n`` bytes inside the zip entry holding ``tensor``'s bytes; returns the entry's name."""
    want = tensor.numpy().tobytes()
    return flip_entry_bytes(path, lambda z, i: "/data/" in i.filename and z.read(i) == want, n)


def test_a_damaged_last_ckpt_is_named_and_last_falls_back_to_the_previous_one(tiny_tokenizer, tmp_path, caplog,
                                                                              monkeypatch):
    import logging

    from arlopti.callbacks.checkpointing import save_atomic
    from arlopti.checkpoints.resume import CheckpointError, resolve_ckpt_path, validate_checkpoint

    monkeypatch.delenv("ARLOPTI_RESOLVED_CKPT", raising=False)
    ckpt_dir = tmp_path / "checkpoints"
    run(tiny_tokenizer, 2, ckpt_dir)
    last, old = ckpt_dir / "last.ckpt", ckpt_dir / "last.ckpt.old"
    assert ckpt_step(last) == 2 and ckpt_step(old) == 1  # the previous verified save is kept
    saved = torch.load(last, map_location="cpu", weights_only=False)
    idx, state = next(iter(saved["optimizer_states"][0]["state"].items()))
    entry = flip_tensor_blob(last, state["exp_avg_sq"])
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {last} is corrupt: entry '{entry}' (tensor "
                                                        f"optimizer_states[0].state.{idx}.exp_avg_sq)")):
        validate_checkpoint(last)
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_checkpoint_metadata(last)
    with caplog.at_level(logging.WARNING, logger="arlopti.checkpoints.resume"):
        found = resolve_ckpt_path("last", output_dir=tmp_path, log_dir=tmp_path / "logs", task_name="t", run_name="r")
    assert found == str(old) and f"falling back to the newest intact checkpoint {old}" in caplog.text

    # resuming from it overwrites the damaged last.ckpt with a verified one
    module, _, _ = run(tiny_tokenizer, 3, ckpt_dir, ckpt_path=found)
    assert module.rollout_step == 3 and ckpt_step(last) == 3 and validate_checkpoint(last) == last

    # a save that fails its verification replaces nothing
    good = last.read_bytes()
    module, _, ckpt = run(tiny_tokenizer, 3, tmp_path / "other")

    def broken(p):
        raise CheckpointError(f"checkpoint file {p} is corrupt: entry 'x' fails its integrity check")

    monkeypatch.setattr("arlopti.callbacks.checkpointing.validate_checkpoint", broken)
    with pytest.raises(CheckpointError, match=r"failed its verification, .*last.ckpt is left as it was"):
        save_atomic(module.trainer, last)
    assert last.read_bytes() == good and not last.with_name("last.ckpt.tmp").exists()
