"""Run names (arlopti/config/run_name.py): what differs from GRPO is in the name, and two different
algorithms (or LoRA ranks, or seeds) never share ``logs/<task_name>/<run_name>``."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from arlopti.config.compose import compose
from arlopti.config.run_name import run_label
from conftest import REPO_ROOT

VARIANTS = (["algorithm.advantage=rloo"], ["algorithm.advantage=drgrpo"], ["algorithm=lopti"],
            ["algorithm=lopti", "algorithm.lopti.eta=0.4"], ["algorithm.kl_coef=0.0"], ["algorithm.clip_high=0.28"],
            ["fidelity=official"], ["algorithm.policy_loss=gspo"], ["model.lora.r=16"], ["model.lora.r=8"],
            ["seed=1"], [])


def _identity(cfg) -> str:
    """What must tell runs apart: the resolved algorithm, the LoRA rank and the seed."""
    return json.dumps([OmegaConf.to_container(cfg.algorithm, resolve=True),
                       OmegaConf.select(cfg, "model.lora.r", default=0), cfg.seed], sort_keys=True, default=str)


def test_different_algorithms_never_share_a_run_folder():
    experiments = sorted(p.stem for p in (REPO_ROOT / "configs" / "experiment").glob("kk_*.yaml"))
    combos = [[f"experiment={e}"] for e in experiments] + [["experiment=kk_grpo", *v] for v in VARIANTS]
    names: dict[str, str] = {}
    for overrides in combos:
        cfg = compose([*overrides, "task_name=same"])
        ident, name = _identity(cfg), cfg.run_name
        assert names.setdefault(name, ident) == ident, f"{overrides} shares the run name {name} with another algorithm"
    assert compose(["experiment=kk_grpo", "algorithm.advantage=rloo"]).run_name == "rloo_s42"
    assert compose(["experiment=kk_grpo"]).run_name == "s42"
    assert compose(["experiment=kk_ar_lopti"]).run_name == "a0.3_e0.5_s42"
    assert compose(["experiment=kk_grpo", "model.lora.r=16", "seed=7"]).run_name == "r16_s7"


def test_run_label_by_hand():
    assert run_label({"advantage": "grpo", "ar_alpha": 0.0, "lopti": {"enabled": False, "eta": 0.5}}, 0, 3) == "s3"
    assert run_label({"advantage": "rloo", "policy_loss": "cispo", "ar_alpha": 0.1,
                      "lopti": {"enabled": True, "eta": 0.4}}, 4, 42) == "rloo_cispo_a0.1_e0.4_r4_s42"
