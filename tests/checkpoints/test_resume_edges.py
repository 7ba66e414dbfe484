"""Resume edges (issue 14, rows 4 and 5).

* Row 4: a run already at its ``rollout_steps`` or ``trainer.max_epochs``, resumed with the same
  settings, does nothing and says so (Lightning's stop check only runs after a step, so it used
  to train and save one step more).
* Row 5: a checkpoint records its data config's identity, and resuming it for other data (K&K
  weights and sampler state for math training) is a config mismatch like any other.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arlopti.config import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def toy_checkpoints(tiny_tokenizer, tmp_path_factory):
    """Real checkpoints of the toy run (2 rollout steps per epoch): stopped by rollout_steps=2 of
    max_epochs=2, and stopped by max_epochs=1 (rollout_steps=null)."""
    from callbacks.test_checkpointing import run

    root = tmp_path_factory.mktemp("toy")
    run(tiny_tokenizer, 2, root / "steps", every=None, epochs=2)
    run(tiny_tokenizer, None, root / "epochs", every=None, epochs=1)
    return {"steps": root / "steps" / "last.ckpt", "epochs": root / "epochs" / "last.ckpt"}


def test_finished_reason_reads_the_step_and_the_epochs(toy_checkpoints):
    from arlopti.checkpoints.resume import finished_reason

    steps, epochs = str(toy_checkpoints["steps"]), str(toy_checkpoints["epochs"])
    assert "rollout step 2 and rollout_steps=2" in finished_reason(steps, 2, 2)
    assert finished_reason(steps, 3, 2) is None  # one epoch of two done, one step left
    assert finished_reason(steps, None, 2) is None
    assert finished_reason(steps, None, -1) is None  # max_epochs=-1: no limit
    assert "finished 1 epoch(s)" in finished_reason(epochs, None, 1)  # saved on the last epoch's last batch
    assert finished_reason(epochs, None, 2) is None
    assert finished_reason(epochs, 5, 2) is None


def test_resuming_a_finished_run_does_nothing(toy_checkpoints, tmp_path, caplog):
    """`train ... rollout_steps=2` then the same with the checkpoint: no third step, no new save."""
    from helpers.compose import compose_train

    from arlopti.entry.train import train

    ckpt = toy_checkpoints["steps"]
    before = (ckpt.stat().st_mtime_ns, ckpt.read_bytes())
    cfg = compose_train(["debug=smoke", "rollout_steps=2", f"ckpt_path={ckpt}", "logger=none"], tmp_path)
    with caplog.at_level(logging.INFO, logger="arlopti.entry.train"):
        out = train(cfg)
    assert out["finished"] and out["module"] is None and out["trainer"] is None
    assert "nothing to do" in caplog.text and str(ckpt) in caplog.text
    assert (ckpt.stat().st_mtime_ns, ckpt.read_bytes()) == before
    assert not list(tmp_path.rglob("*.ckpt"))  # no new checkpoint anywhere in the run's folders


def compose_data(experiment: str, tmp_path: Path):
    from helpers.compose import compose_train

    return compose_train([f"experiment={experiment}", "debug=smoke"], tmp_path)


def test_a_checkpoint_records_its_data_and_other_data_is_a_mismatch(tiny_tokenizer, tmp_path, caplog):
    from callbacks.test_checkpointing import make_cfg

    from arlopti.learner.module import GRPOModule
    from arlopti.checkpoints.resume import check_resume_compatible
    from arlopti.entry.train import data_signature

    kk, dsr = (data_signature(compose_data(e, tmp_path).data) for e in ("kk_lopti", "dsr_lopti"))
    assert kk["_target_"].endswith("KKDataModule") and dsr["_target_"].endswith("MathDataModule")
    assert dsr["dataset_name"] == "dsr_uniform" and "train_file" in dsr and "template" in kk

    run = make_cfg()
    module = GRPOModule(run, tokenizer=tiny_tokenizer, data_signature=kk)
    assert module.hparams["data"] == kk  # saved with the checkpoint's hyper_parameters
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "arlopti": {"rollout_step": 1}, "optimizer_states": [],
                "hyper_parameters": dict(module.hparams)}, ckpt)

    check_resume_compatible(str(ckpt), run, data=kk)  # same data: fine
    with pytest.raises(ConfigError) as err:
        check_resume_compatible(str(ckpt), run, data=dsr)
    msg = str(err.value)
    assert re.search(r"data\._target_: checkpoint '.*KKDataModule', this run '.*MathDataModule'", msg)
    assert "data.dataset_name: checkpoint '<absent>', this run 'dsr_uniform'" in msg
    assert "allow_config_mismatch=true" in msg
    with caplog.at_level(logging.WARNING, logger="arlopti.entry.train"):
        check_resume_compatible(str(ckpt), run, allow_mismatch=True, data=dsr)
    assert "data._target_" in caplog.text

    old = tmp_path / "old.ckpt"  # saved before the data identity was recorded: a warning only
    torch.save({"state_dict": {}, "hyper_parameters": {"run": asdict(run)}}, old)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="arlopti.entry.train"):
        check_resume_compatible(str(old), run, data=dsr)
    assert "records no data config" in caplog.text


@pytest.mark.slow
def test_the_repro_train_twice_with_rollout_steps_2(tmp_path, caplog):
    """The issue's repro through train(): `rollout_steps=2`, then the same with the checkpoint."""
    from helpers.compose import compose_train

    from arlopti.checkpoints.resume import load_checkpoint_metadata
    from arlopti.entry.train import train

    args = ["experiment=kk_lopti", "debug=smoke", "data=kk_generated", "rollout_steps=2", "logger=none",
            "~callbacks.benchmark_eval"]
    first = train(compose_train(args, tmp_path / "one"))
    assert first["module"].rollout_step == 2
    ckpt = next((tmp_path / "one").rglob("last.ckpt"))
    before = ckpt.read_bytes()
    with caplog.at_level(logging.INFO, logger="arlopti.entry.train"):
        again = train(compose_train([*args, f"ckpt_path={ckpt}"], tmp_path / "two"))
    assert again["finished"] == "checkpoint is at rollout step 2 and rollout_steps=2"
    assert "nothing to do" in caplog.text
    assert ckpt.read_bytes() == before and load_checkpoint_metadata(ckpt)["arlopti"]["rollout_step"] == 2
    assert not list((tmp_path / "two").rglob("*.ckpt"))


@pytest.mark.slow
def test_the_repro_kk_checkpoint_resumed_for_math_is_refused(tmp_path):
    """`experiment=kk_lopti debug=smoke`, then `experiment=dsr_lopti debug=smoke` from its checkpoint:
    the run configs agree, the data does not."""
    from conftest import FIXTURES
    from helpers.compose import compose_train

    from arlopti.entry.train import train

    if not (FIXTURES / "kk").exists() or not (FIXTURES / "math").exists():
        pytest.skip("needs the shared K&K and math fixtures")
    common = ["debug=smoke", "rollout_steps=1", "logger=none", "~callbacks.benchmark_eval"]
    train(compose_train(["experiment=kk_lopti", *common], tmp_path / "kk"))
    ckpt = next((tmp_path / "kk").rglob("last.ckpt"))
    with pytest.raises(ConfigError) as err:
        train(compose_train(["experiment=dsr_lopti", *common, "rollout_steps=2", f"ckpt_path={ckpt}"],
                            tmp_path / "dsr"))
    assert re.search(r"data\._target_: checkpoint '.*KKDataModule', this run '.*MathDataModule'", str(err.value))
    assert "algorithm." not in str(err.value)  # the run configs agree: only the data differs
