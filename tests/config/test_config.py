"""The run config has one source of truth (issue 13): the dataclasses in ``arlopti.config``,
registered as Hydra schemas. YAML only overrides them, every field has a help text, the
generated reference is current, ``python train.py`` validates once, and no group writes
outside its own package."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf

from arlopti import config as config_mod
from arlopti.config.compose import compose
from arlopti.config import rules as config_rules
from arlopti.config import (AlgorithmConfig, ConfigError, LoptiConfig, RunConfig, SizesConfig, TinyModelConfig,
                            from_dict, saved_run_as_current, schemas, validate_once, walk_fields)
from conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"


def compose_train(overrides: list[str], tmp_path, searchpath=None):
    extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
    return compose([f"paths.output_dir={tmp_path}", f"paths.log_dir={tmp_path}/logs", *extra, *overrides],
                   config_dir=CONFIGS)


# ---- YAML only overrides the schema ---------------------------------------------------------
def test_yaml_cannot_set_an_unknown_key(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text(
        "# @package _global_\nalgorithm:\n  lopti:\n    etta: 0.4\n")
    with pytest.raises(Exception, match=r"etta") as err:
        compose_train(["experiment=typo"], tmp_path / "out", searchpath=tmp_path)
    assert "LoptiConfig" in str(err.value) or "LoptiConfig" in str(err.value.__cause__)


def test_command_line_cannot_set_an_unknown_key_or_a_wrong_type(tmp_path):
    from arlopti.entry.train import run_config

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
    from arlopti.entry.train import run_config

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
    from arlopti.entry.train import run_config

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
    from arlopti.entry.train import check_resume_compatible

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
    from arlopti.config.docs import render

    path = REPO_ROOT / "docs" / "config.md"
    assert path.read_text() == render(), "docs/config.md is stale: python -m arlopti.config.docs > docs/config.md"


# ---- one TinySpec ----------------------------------------------------------------------------
def test_tiny_spec_is_the_config_dataclass():
    from arlopti.models.loading import TinySpec

    assert TinySpec is TinyModelConfig
    assert (TinyModelConfig().num_heads, TinyModelConfig().num_kv_heads, TinyModelConfig().hidden_size) == (4, 2, 64)


# ---- validation once ------------------------------------------------------------------------
def test_validate_run_runs_once_per_build(tmp_path, monkeypatch):
    from arlopti.entry.train import build

    calls = []
    real = config_rules.validate_run
    monkeypatch.setattr(config_rules, "validate_run", lambda cfg, world_size=1: calls.append(world_size) or
                        real(cfg, world_size))
    cfg = compose_train(["debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
                         "logger=none", "~callbacks.benchmark_eval"], tmp_path)
    trainer, module, _ = build(cfg)
    module.trainer = trainer
    module.setup("fit")  # what fit calls next: the config passed for this world size already
    assert calls == [1]


def test_validate_once_revalidates_a_changed_config_or_another_world_size(monkeypatch):
    calls = []
    real = config_rules.validate_run
    monkeypatch.setattr(config_rules, "validate_run", lambda cfg, world_size=1: calls.append(world_size) or
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


# ---- typed values: no silent wrong type (issue 14, row 1) -------------------------------------
def _train_script():
    """What ``python train.py`` / ``python eval.py`` run before Hydra composes."""
    import arlopti.entry.cli

    return arlopti.entry.cli


def _refused_on_the_command_line(override: str) -> str:
    """The message ``python train.py <override>`` exits with (it must exit)."""
    with pytest.raises(SystemExit) as err:
        _train_script().check_command_line([override])
    return str(err.value.code)


def _typed_fields(kind):
    from arlopti.config import field_types

    return [(key, f, hint) for key, f, hint in field_types(RunConfig)
            if config_mod.unwrap_optional(hint)[0] is kind]


#: the wrong values of the sweep, per field type
WRONG = {bool: ["no", "off", "yes", "on", "1"], int: ["4.5", "true"],
         float: ["inf", "-inf", "nan", "abc", "true"]}


@pytest.mark.parametrize("kind", [bool, int, float])
def test_every_typed_field_refuses_a_wrong_type_on_the_command_line(kind):
    """Full-type sweep: every bool, int and float field of every config dataclass (walked from the
    dataclasses), each wrong value: ``python train.py key=value`` exits before composing, with
    ``key=value: expected <type>``; the right type passes."""
    from arlopti.config.docs import _yaml

    fields = _typed_fields(kind)
    assert len(fields) >= {bool: 6, int: 20, float: 14}[kind]
    script = _train_script()
    for key, f, hint in fields:
        for value in WRONG[kind]:
            with pytest.raises(SystemExit) as err:
                script.check_command_line([f"{key}={value}"])
            message = str(err.value.code)
            assert message.startswith(f"ConfigError: {key}={value}: expected "), message
            assert {bool: "a bool (true or false)", int: "an int", float: "a finite float"}[kind] in message
        script.check_command_line([f"{key}={_yaml(config_mod.field_default(f))}"])  # its default passes
        nullable = "None" in str(hint)
        refused = pytest.raises(ConfigError, match=rf"^{key}=null: expected")
        with contextlib.nullcontext() if nullable else refused:
            config_mod.check_overrides([f"{key}=null"])


@pytest.mark.parametrize("kind", [bool, int, float])
def test_every_typed_field_refuses_a_wrong_type_after_composition(kind, tmp_path):
    """The second layer: a wrong value that reaches the typed run config (a Python caller, an
    interpolation, a YAML file) is refused by validate_run, naming the key."""
    from arlopti.entry.train import run_config

    wrong = {bool: ["no", 1, None], int: [4.5, True, "4"],
             float: [math.inf, -math.inf, math.nan, True, "abc"]}
    base = run_config(compose_train([], tmp_path))
    for key, f, hint in _typed_fields(kind):
        for value in wrong[kind]:
            if value is None and "None" in str(hint):
                continue
            run = copy.deepcopy(base)
            *path, name = key.split(".")
            owner = run
            for part in path:  # a YAML key may be an alias of its field (rollout.async -> async_)
                owner = getattr(owner, part) if hasattr(owner, part) else getattr(owner, part + "_")
            setattr(owner, name, value)
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=\S+: expected "):
                config_mod.validate_run(run)


def test_tuples_need_their_length():
    config_mod.validate_run(RunConfig(optim=config_mod.OptimConfig(betas=[0.9, 0.95])))
    for betas, shown in [((0.9,), r"\[0\.9\]"), ((0.9, 0.99, 0.999), r"\[0\.9, 0\.99, 0\.999\]"),
                         ((0.9, math.inf), r"\[0\.9, inf\]"), ((0.9, "x"), r"\[0\.9, x\]")]:
        with pytest.raises(ConfigError, match=rf"^optim\.betas={shown}: expected a list of exactly 2 floats"):
            config_mod.validate_run(RunConfig(optim=config_mod.OptimConfig(betas=betas)))


def test_inf_only_where_the_range_is_closed_at_infinity():
    from arlopti.config import check_value, setting

    @dataclasses.dataclass
    class Limits:
        open_end: float = setting(1.0, "x", range="(0, inf)")
        closed_end: float = setting(1.0, "x", range="[0, inf]")

    open_end, closed_end = dataclasses.fields(Limits)
    check_value("closed_end", math.inf, float, closed_end)
    with pytest.raises(ConfigError, match=r"^open_end=inf: expected a finite float$"):
        check_value("open_end", math.inf, float, open_end)
    with pytest.raises(ConfigError, match=r"^closed_end=nan: expected a finite float or inf$"):
        check_value("closed_end", math.nan, float, closed_end)


def test_well_typed_overrides_pass():
    config_mod.check_overrides([
        "algorithm.lopti.enabled=true", "algorithm.lopti.enabled=False", "+algorithm.lopti.reverse=TRUE",
        "optim.lr=1e-5", "optim.lr=1", "optim.betas=[0.9,0.95]", "algorithm.dual_clip=null",
        "sizes.micro_batch_tokens=null", "sizes.micro_batch_tokens=4096", "rollout.top_k=-1",
        "algorithm=lopti", "experiment=kk_grpo", "~callbacks.benchmark_eval", "trainer.devices=abc",
        "optim.lr=${oc.env:LR,1e-6}", "optim.betas=[0.9,${oc.env:B2,0.999}]", "optim.lr=1e-5,2e-5", "sizes.group_size=range(2,8)",
        "model.name_or_path=1", "rollout.stop=[a,b]", "hydra.run.dir=x"])
    # a --multirun choice sweep: every choice is checked
    with pytest.raises(ConfigError, match=r"^optim\.lr=inf: expected a finite float"):
        config_mod.check_overrides(["optim.lr=1e-5,inf"])


def test_train_script_reads_the_overrides_as_hydra_does():
    script = _train_script()
    assert script.command_line_overrides(["-m", "a=1", "--config-name", "x", "b=no", "--cfg", "job"]) == \
        ["a=1", "b=no"]


# The repros of issue 14, row 1: what each command line says now.
ISSUE_14_ROW_1 = [
    ("algorithm.lopti.enabled=no", "algorithm.lopti.enabled=no: expected a bool (true or false)"),
    ("algorithm.lopti.enabled=off", "algorithm.lopti.enabled=off: expected a bool (true or false)"),
    ("algorithm.ar_alpha=true", "algorithm.ar_alpha=true: expected a finite float"),
    ("sizes.group_size=4.0", "sizes.group_size=4.0: expected an int"),
    ("rollout.max_new_tokens=16.5", "rollout.max_new_tokens=16.5: expected an int"),
    ("optim.betas=[0.9]", "optim.betas=[0.9]: expected a list of exactly 2 floats"),
    ("optim.lr=inf", "optim.lr=inf: expected a finite float"),
    ("rollout.temperature=inf", "rollout.temperature=inf: expected a finite float"),
    ("algorithm.ar_alpha=abc", "algorithm.ar_alpha=abc: expected a finite float"),
]


@pytest.mark.parametrize("override,message", ISSUE_14_ROW_1)
def test_issue_14_row_1_repros(override, message, tmp_path):
    from arlopti.entry.train import build

    assert _refused_on_the_command_line(override) == f"ConfigError: {message} (command-line override)"
    # Without that check, what composing would do: Hydra refuses some (its message names the key),
    # OmegaConf converts `no`/`off` to False, and `build` refuses what composes but is still wrong.
    key, value = override.split("=", 1)
    try:
        cfg = compose_train(["debug=smoke", "data=kk_generated", "logger=none", override], tmp_path)
    except Exception as err:  # noqa: BLE001 - Hydra's ConfigCompositionException
        hydra_message = f"{err}\n{err.__cause__}"
        assert f"Error merging override {override}" in hydra_message
        assert f"full_key: {key}" in hydra_message
        return
    if value in ("no", "off"):
        assert OmegaConf.select(cfg, key) is False  # the silent conversion the command-line check prevents
        return
    with pytest.raises(ConfigError, match=rf"^{re.escape(message)}$"):
        build(cfg)


def test_yaml_booleans_are_true_or_false():
    """OmegaConf's YAML loader reads YAML 1.1 `no`/`off`/`yes`/`on` as booleans before any check can
    see them, so the repository's configs write only `true`/`false`."""
    assert OmegaConf.create("enabled: no\nreverse: on")["enabled"] is False
    offenders = [f"{path.relative_to(CONFIGS)}:{n}: {line.strip()}"
                 for path in sorted(CONFIGS.rglob("*.yaml"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r":\s*['\"]?(yes|no|on|off|y|n)['\"]?\s*(#.*)?$", line, re.IGNORECASE)]
    assert not offenders, offenders


@pytest.mark.process


def test_python_train_py_refuses_lopti_enabled_no(tmp_path):
    """The real command line, one process: exits non-zero with the key on stderr, before any work."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), "experiment=kk_grpo", "debug=smoke",
                           "data=kk_generated", "algorithm.lopti.enabled=no",
                           f"hydra.run.dir={tmp_path}/run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "algorithm.lopti.enabled=no: expected a bool (true or false)" in proc.stderr, proc.stderr
