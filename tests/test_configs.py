"""The paper experiments' GPU defaults (bf16 vLLM and reference, FSDP2 over all visible devices),
``fidelity=official`` end to end, and bad ``tasks`` / ``fidelity`` input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from arlopti.config import ConfigError
from conftest import REPO_ROOT
from helpers.compose import compose_train

PAPER = ["kk_grpo", "kk_ar", "kk_lopti", "kk_ar_lopti", "dsr_grpo", "dsr_ar", "dsr_lopti", "dsr_ar_lopti",
         "orz_grpo", "orz_ar", "orz_lopti", "orz_ar_lopti"]


@pytest.mark.parametrize("name", PAPER)
def test_paper_experiments_run_vllm_and_reference_in_bf16_under_fsdp2_on_all_gpus(name, tmp_path):
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert cfg.rollout.backend == "vllm" and cfg.rollout.dtype == "bfloat16" and cfg.rollout.enable_sleep
    assert cfg.model.dtype == "float32" and cfg.model.ref_dtype == "bfloat16"
    t = cfg.trainer
    assert t.accelerator == "gpu" and t.devices == "auto" and t.precision == "32-true"
    assert t.strategy._target_ == "arlopti.learner.sharding.FSDP2Strategy"
    assert (t.strategy.mixed_precision, t.strategy.reduce_dtype) == ("bf16", "float32")


def test_smoke_puts_the_gpu_settings_back_to_fp32_on_cpu(tmp_path):
    cfg = compose_train(["experiment=kk_ar_lopti", "debug=smoke"], tmp_path)
    assert cfg.trainer.accelerator == "cpu" and cfg.rollout.dtype is None and cfg.model.ref_dtype is None


@pytest.mark.process


def test_cfg_job_shows_bf16_and_fsdp2():
    out = subprocess.run([sys.executable, "train.py", "experiment=kk_grpo", "--cfg", "job"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "ref_dtype: bfloat16" in out and "dtype: bfloat16" in out
    assert "FSDP2Strategy" in out and "mixed_precision: bf16" in out and "devices: auto" in out


def test_reference_model_is_built_in_its_own_dtype(tiny_tokenizer):
    import torch

    from arlopti.config import ModelConfig, RunConfig
    from arlopti.learner.module import GRPOModule

    module = GRPOModule(RunConfig(model=ModelConfig(ref_dtype="bfloat16")), tokenizer=tiny_tokenizer)
    assert next(module.policy.parameters()).dtype == torch.float32
    assert next(module.ref.parameters()).dtype == torch.bfloat16


@pytest.mark.slow
def test_fidelity_official_trains_a_step(tmp_path):
    from arlopti.entry.train import train

    cfg = compose_train(["experiment=kk_ar_lopti", "debug=smoke", "data=kk_generated", "fidelity=official",
                         "rollout_steps=1", "logger=none", "~callbacks.benchmark_eval"], tmp_path)
    module = train(cfg)["module"]
    assert module.cfg.optim.lr_schedule == "verl" and module.rollout_step == 1
    # the first phase pass ran at lr 0, the second at the full lr
    assert module.optimizers().param_groups[0]["lr"] == pytest.approx(cfg.optim.lr)


@pytest.mark.parametrize("override,key", [("tasks.math.grader=sympy", "tasks.math"),
                                          ("+tasks.nosuch.x=1", "tasks.nosuch")])
def test_bad_task_options_name_the_key(override, key, tmp_path):
    from arlopti.entry.train import build

    cfg = compose_train(["experiment=kk_ar_lopti", "debug=smoke", "data=kk_generated", override], tmp_path)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(cfg)


def test_unknown_fidelity_option_lists_the_options(tmp_path):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="fidelity/exact") as err:
        compose_train(["fidelity=exact"], tmp_path)
    assert "improved" in str(err.value) and "official" in str(err.value)
