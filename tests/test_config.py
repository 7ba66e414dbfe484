"""The run config has one source of truth (issue 13): the dataclasses in ``arlopti.config``,
registered as Hydra schemas. YAML only overrides them, every field has a help text, the
generated reference is current, ``python train.py`` validates once, and no group writes
outside its own package."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from arlopti import config as config_mod
from arlopti.config import (AlgorithmConfig, ConfigError, LoptiConfig, RunConfig, SizesConfig, TinyModelConfig,
                            from_dict, saved_run_as_current, schemas, validate_once, walk_fields)
from conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"


def compose_train(overrides: list[str], tmp_path, searchpath=None):
    GlobalHydra.instance().clear()
    extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
            return compose("train.yaml", overrides=[f"paths.output_dir={tmp_path}", f"paths.log_dir={tmp_path}/logs",
                                                    *extra, *overrides])
    finally:
        GlobalHydra.instance().clear()


# ---- YAML only overrides the schema ---------------------------------------------------------
def test_yaml_cannot_set_an_unknown_key(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text(
        "# @package _global_\nalgorithm:\n  lopti:\n    etta: 0.4\n")
    with pytest.raises(Exception, match=r"etta") as err:
        compose_train(["experiment=typo"], tmp_path / "out", searchpath=tmp_path)
    assert "LoptiConfig" in str(err.value) or "LoptiConfig" in str(err.value.__cause__)


def test_command_line_cannot_set_an_unknown_key_or_a_wrong_type(tmp_path):
    from arlopti.train import run_config

    with pytest.raises(Exception, match=r"sizes\.nosuch"):
        compose_train(["sizes.nosuch=1"], tmp_path)
    # `+key=` makes Hydra add it anyway: the typed run config still refuses it, by name
    with pytest.raises(ConfigError, match=r"sizes: unknown key\(s\) \['nosuch'\]"):
        run_config(compose_train(["+sizes.nosuch=1"], tmp_path))
    with pytest.raises(Exception, match=r"sizes.group_size"):
        compose_train(["sizes.group_size=many"], tmp_path)


def test_groups_compose_to_the_dataclass_defaults(tmp_path):
    """A group's YAML sets only what differs: `algorithm=grpo`, `model=tiny`, the sizes and optim
    of train.yaml are the dataclasses' defaults exactly (rollout: but for `seed: ${seed}`)."""
    from arlopti.train import run_config

    run = run_config(compose_train(["rollout.seed=0"], tmp_path))
    assert asdict(run) == asdict(RunConfig())


@pytest.mark.parametrize("group,choice", [("algorithm", "grpo"), ("algorithm", "ar"), ("algorithm", "lopti"),
                                          ("algorithm", "ar_lopti"), ("model", "tiny"), ("model", "tiny_vllm"),
                                          ("model", "qwen2.5-3b-instruct"), ("rollout", "hf"), ("rollout", "vllm")])
def test_every_group_file_extends_its_schema(group, choice, tmp_path):
    text = (CONFIGS / group / f"{choice}.yaml").read_text()
    assert "@package" not in text  # no group writes outside its own package
    parent = OmegaConf.load(CONFIGS / group / f"{choice}.yaml").defaults[0]
    assert parent == "schema" or (CONFIGS / group / f"{parent}.yaml").exists()


# ---- the algorithm follows from its switches --------------------------------------------------
def test_algorithm_label_is_derived_and_name_is_gone(tmp_path):
    from arlopti.train import run_config

    for choice, label in [("grpo", "grpo"), ("ar", "ar"), ("lopti", "lopti"), ("ar_lopti", "ar_lopti")]:
        run = run_config(compose_train([f"algorithm={choice}"], tmp_path))
        assert run.algorithm.label == label
    assert AlgorithmConfig(lopti=LoptiConfig(enabled=True)).label == "lopti"
    with pytest.raises(ConfigError, match=r"algorithm.name was removed.*ar_alpha.*lopti.enabled"):
        from_dict(RunConfig, {"algorithm": {"name": "lopti"}}, "")
    with pytest.raises(Exception, match=r"algorithm\.name"):
        compose_train(["algorithm.name=lopti"], tmp_path)
    # old Python callers: a name that agrees with the switches is ignored, one that does not is refused
    with pytest.warns(DeprecationWarning, match="ignored"):
        assert "name" not in asdict(AlgorithmConfig(name="ar", ar_alpha=0.3))
    with pytest.raises(ConfigError, match=r"algorithm.name='lopti' disagrees .*lopti.enabled=False"):
        AlgorithmConfig(name="lopti")


def test_an_old_checkpoint_with_algorithm_name_is_still_comparable(tmp_path):
    """hyper_parameters.run of a checkpoint saved before: `algorithm.name` set, and no key added since
    (`model.tiny.max_position_embeddings`). The same run compares equal; a real change is still listed."""
    from arlopti.train import check_resume_compatible

    run = RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3))
    saved = asdict(run)
    saved["algorithm"]["name"] = "ar"
    del saved["model"]["tiny"]["max_position_embeddings"]
    ckpt = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"run": saved}}, ckpt)
    check_resume_compatible(str(ckpt), run)
    assert saved_run_as_current(saved)["model"]["tiny"]["max_position_embeddings"] == 8192
    with pytest.raises(ConfigError, match=r"algorithm.ar_alpha: checkpoint 0.3, this run 0.0"):
        check_resume_compatible(str(ckpt), RunConfig())


# ---- help texts and the generated reference -------------------------------------------------
def test_every_field_has_a_help_text():
    missing = [key for key, f, _ in walk_fields(RunConfig) if not f.metadata.get("help", "").strip()]
    assert not missing, f"fields without metadata['help']: {missing}"
    assert set(schemas()) == {"algorithm", "optim", "sizes", "model", "rollout"}


def test_docs_config_md_is_current():
    from arlopti.config_docs import render

    path = REPO_ROOT / "docs" / "config.md"
    assert path.read_text() == render(), "docs/config.md is stale: python -m arlopti.config_docs > docs/config.md"


# ---- one TinySpec ----------------------------------------------------------------------------
def test_tiny_spec_is_the_config_dataclass():
    from arlopti.models import TinySpec

    assert TinySpec is TinyModelConfig
    assert (TinyModelConfig().num_heads, TinyModelConfig().num_kv_heads, TinyModelConfig().hidden_size) == (4, 2, 64)


# ---- validation once ------------------------------------------------------------------------
def test_validate_run_runs_once_per_build(tmp_path, monkeypatch):
    from arlopti.train import build

    calls = []
    real = config_mod.validate_run
    monkeypatch.setattr(config_mod, "validate_run", lambda cfg, world_size=1: calls.append(world_size) or
                        real(cfg, world_size))
    cfg = compose_train(["debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
                         "logger=none", "~callbacks.benchmark_eval"], tmp_path)
    trainer, module, _ = build(cfg)
    module.trainer = trainer
    module.setup("fit")  # what fit calls next: the config passed for this world size already
    assert calls == [1]


def test_validate_once_revalidates_a_changed_config_or_another_world_size(monkeypatch):
    calls = []
    real = config_mod.validate_run
    monkeypatch.setattr(config_mod, "validate_run", lambda cfg, world_size=1: calls.append(world_size) or
                        real(cfg, world_size))
    cfg = RunConfig(sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2))
    validate_once(cfg, 2)
    validate_once(cfg)  # GRPOModule.__init__: any earlier pass will do
    validate_once(cfg, 2)
    assert calls == [2]
    validate_once(cfg, 1)
    assert calls == [2, 1]
    cfg.sizes = dataclasses.replace(cfg.sizes, micro_batch_size=3)
    with pytest.raises(ConfigError, match="sizes.micro_batch_size=3"):
        validate_once(cfg, 1)


# ---- rollout=vllm touches rollout.* only ------------------------------------------------------
def test_vllm_rollout_does_not_touch_the_model(tmp_path):
    hf = compose_train(["rollout=hf"], tmp_path)
    vllm = compose_train(["rollout=vllm"], tmp_path)
    assert OmegaConf.to_container(vllm.model) == OmegaConf.to_container(hf.model)
    assert vllm.model.tiny.num_heads == TinyModelConfig().num_heads
    assert vllm.rollout.backend == "vllm"
    # the paper experiments' 3B model shows the schema's tiny defaults, whatever the rollout
    exp = compose_train(["experiment=kk_grpo"], tmp_path)
    assert exp.rollout.backend == "vllm" and exp.model.tiny.num_heads == 4 and exp.model.tiny.num_kv_heads == 2
    # the smoke run picks the vLLM-compatible tiny model itself, for either backend
    smoke = compose_train(["experiment=kk_lopti", "debug=smoke", "rollout=vllm"], tmp_path)
    assert smoke.rollout.backend == "vllm"
    assert smoke.model.tiny.hidden_size // smoke.model.tiny.num_heads == 32
