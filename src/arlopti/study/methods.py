"""The study's methods: names of experiment files, each one's algorithm read from its file.

A method ``m`` is the experiment ``configs/experiment/kk_<m>.yaml``; its
:class:`~arlopti.config.AlgorithmConfig` is that file's composed ``algorithm`` node
(:func:`method_algorithm`), so a method's settings are written once, in its experiment file, and
the study runs what ``python train.py experiment=kk_<m>`` would train with. The study takes the
algorithm only: the model, the sizes, the optimizer and the rollout are the study's own.

Runs take a method as Hydra overrides (:func:`algorithm_overrides`: its ``algorithm`` node written as
overrides of ``algorithm=grpo``), and :func:`check_run_algorithm` checks in the run's own composed config
(``.hydra/config.yaml``) that the run trained exactly that algorithm.

The default list (:func:`default_methods`): GRPO, AR, Lopti, AR + Lopti, the step-matched controls
(:data:`CONTROLS`), then every other
``kk_<m>.yaml`` that sets one method on its own, in name order, so that a rival lands in the study
as soon as its experiment file does. Left out by rule:

* compositions, ``kk_<m>_lopti`` / ``kk_<m>_ar_lopti`` / ``kk_<m>_ar`` (ask for them with ``--methods``);
* :data:`NOT_TOKEN_LEVEL`, the experiments that are not token-level methods, each with its reason.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict
from pathlib import Path

from arlopti.config import AlgorithmConfig, from_dict
from arlopti.config.compose import override_value

log = logging.getLogger(__name__)

BASE_METHODS = ("grpo", "ar", "lopti", "ar_lopti")
#: The step-matched controls (issue 51): Lopti's and AR + Lopti's two passes per rollout batch over every token
#: (configs/algorithm/grpo_two_steps.yaml); listed right after the base four when their files are there.
CONTROLS = ("grpo_two_steps", "ar_two_steps")
COMPOSITION_SUFFIXES = ("_ar_lopti", "_lopti", "_ar")
#: Experiment files that are not a token-level method of their own, and why they stay out.
NOT_TOKEN_LEVEL = {
    "lopti_demo": "the CPU demo's run settings, not a method",
    "gspo": "a sequence-level ratio: no per-token weighting to compare",
    "rpp": "an advantage estimator (REINFORCE++), not a token-level method",
    "dapo": "its dynamic sampling needs the training loop's rollout callback (the study's rollouts refuse it)",
}


def experiment_dir(config_dir: str | Path | None = None) -> Path:
    from arlopti.config.compose import prepare

    return prepare(config_dir) / "experiment"


def available_methods(config_dir: str | Path | None = None) -> list[str]:
    """Every ``m`` with a ``kk_<m>.yaml`` experiment file, in name order."""
    return sorted(p.stem[len("kk_"):] for p in experiment_dir(config_dir).glob("kk_*.yaml"))


def default_methods(config_dir: str | Path | None = None) -> list[str]:
    """The base four, then every single-method experiment (module docstring)."""
    found = available_methods(config_dir)
    missing = [m for m in BASE_METHODS if m not in found]
    if missing:
        raise FileNotFoundError(f"experiment files kk_{missing[0]}.yaml ... are missing from "
                                f"{experiment_dir(config_dir)}: the study needs {list(BASE_METHODS)}")
    controls = [m for m in CONTROLS if m in found]
    rest = [m for m in found if m not in BASE_METHODS and m not in CONTROLS and m not in NOT_TOKEN_LEVEL
            and not any(m.endswith(s) for s in COMPOSITION_SUFFIXES)]
    return list(BASE_METHODS) + controls + rest


def parse_methods(text: str | None, config_dir: str | Path | None = None) -> list[str]:
    """``--methods``: None or ``"all"`` = :func:`default_methods`; else a comma list of experiment
    names (``grpo,ar_lopti,...``), each checked to have its file; GRPO is added first when absent
    (it is every paired comparison's baseline)."""
    if text is None or text.strip() == "all":
        return default_methods(config_dir)
    names = [m.strip() for m in text.split(",") if m.strip()]
    found = set(available_methods(config_dir))
    unknown = [m for m in names if m not in found]
    if unknown:
        raise ValueError(f"--methods {unknown}: no configs/experiment/kk_<name>.yaml; choose from {sorted(found)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--methods {text!r} names a method twice")
    return names if "grpo" in names else ["grpo", *names]


def method_algorithm(method: str, max_new_tokens: int, config_dir: str | Path | None = None) -> AlgorithmConfig:
    """The ``algorithm`` node of ``experiment=kk_<method>``, composed with the study's response
    length (``rollout.max_new_tokens``: interpolations such as DAPO's overlong buffer read it)."""
    from omegaconf import OmegaConf

    from arlopti.config.compose import compose

    cfg = compose([f"experiment=kk_{method}", f"rollout.max_new_tokens={max_new_tokens}"], config_dir=config_dir)
    return from_dict(AlgorithmConfig, OmegaConf.to_container(cfg.algorithm, resolve=True), "algorithm")


def method_algorithms(methods: list[str], max_new_tokens: int, config_dir: str | Path | None = None
                      ) -> dict[str, AlgorithmConfig]:
    """:func:`method_algorithm` of each method, in order."""
    return {m: method_algorithm(m, max_new_tokens, config_dir) for m in methods}


# ------------------------------------------------------------------------------------------ as overrides
def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a.b": v}`` from ``{"a": {"b": v}}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@functools.lru_cache(maxsize=None)
def algorithm_fields(method: str, max_new_tokens: int, config_dir=None) -> tuple:
    """``((dotted key, value), ...)``: the method's :func:`method_algorithm`, flattened; composed once per
    process and arguments (a compose costs about a second)."""
    return tuple(flatten(asdict(method_algorithm(method, max_new_tokens, config_dir))).items())


def algorithm_overrides(method: str, max_new_tokens: int, config_dir=None) -> list[str]:
    """``["algorithm=grpo", "algorithm.<key>=<value>", ...]``: the method's ``algorithm`` node as
    overrides of GRPO's, every key where it differs except ``kl_coef`` (the run's own is kept)."""
    base = dict(algorithm_fields("grpo", max_new_tokens, config_dir))
    return ["algorithm=grpo"] + [f"algorithm.{k}={override_value(v)}" for k, v in
                                 algorithm_fields(method, max_new_tokens, config_dir)
                                 if k != "kl_coef" and base.get(k) != v]


def run_algorithm(run_dir: Path) -> dict:
    """The ``algorithm`` a run trained with, from its composed config (``<run_dir>/.hydra/config.yaml``)."""
    from omegaconf import OmegaConf

    saved = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml")
    return asdict(from_dict(AlgorithmConfig, OmegaConf.to_container(saved.algorithm, resolve=True), "algorithm"))


def check_run_algorithm(run_dir: Path, method: str, max_new_tokens: int, config_dir=None,
                        also: dict | None = None) -> None:
    """Refuse a run whose composed ``algorithm`` is not the method's (``kl_coef`` aside; ``also``: keys
    whose value the run itself set, e.g. ``{"kl_coef": 0.0}``)."""
    got = flatten(run_algorithm(run_dir))
    want = {**{k: v for k, v in algorithm_fields(method, max_new_tokens, config_dir) if k != "kl_coef"},
            **(also or {})}
    diff = sorted(k for k, v in want.items() if v != got.get(k))
    if diff:
        raise RuntimeError(f"{run_dir}: the run's algorithm differs from kk_{method}'s at {diff}")
