"""Build everything a run needs from a composed Hydra config, then fit.

``train(cfg)`` is what ``python train.py`` calls; tests call it with a composed config.
Order: seed → typed, validated run config → tokenizer → DataModule → learner → callbacks and
loggers → Trainer → ``fit`` (resuming from ``ckpt_path`` when given).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
import lightning.pytorch as L
from omegaconf import DictConfig, OmegaConf

from arlopti.config import (AlgorithmConfig, ConfigError, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                            SizesConfig, from_dict, validate_run)

log = logging.getLogger(__name__)


def run_config(cfg: DictConfig) -> RunConfig:
    """The typed :class:`RunConfig` of a composed config (unknown keys are errors)."""
    def node(name):
        return OmegaConf.to_container(cfg[name], resolve=True) if name in cfg else {}

    return RunConfig(
        algorithm=from_dict(AlgorithmConfig, node("algorithm"), "algorithm"),
        optim=from_dict(OptimConfig, node("optim"), "optim"),
        sizes=from_dict(SizesConfig, node("sizes"), "sizes"),
        model=from_dict(ModelConfig, node("model"), "model"),
        rollout=from_dict(RolloutConfig, node("rollout"), "rollout"),
    )


def world_size(cfg: DictConfig) -> int:
    devices = cfg.trainer.get("devices", 1)
    n = devices if isinstance(devices, int) and devices > 0 else (len(devices) if isinstance(devices, (list, tuple)) else 1)
    return n * int(cfg.trainer.get("num_nodes", 1))


def instantiate_dict(node: DictConfig | None) -> list:
    """Instantiate every ``_target_`` entry of a dict-style group (callbacks, loggers)."""
    if not node:
        return []
    return [hydra.utils.instantiate(v) for v in node.values() if isinstance(v, DictConfig) and "_target_" in v]


def resolve_ckpt_path(ckpt_path: str | None, cfg: DictConfig) -> str | None:
    if ckpt_path in (None, ""):
        return None
    if ckpt_path == "last":
        from arlopti.callbacks.checkpointing import find_last_checkpoint

        found = find_last_checkpoint(cfg)
        if found is None:
            raise FileNotFoundError(
                f"ckpt_path=last: no last.ckpt under {cfg.paths.output_dir}/checkpoints or earlier runs of "
                f"task_name={cfg.task_name} in {cfg.paths.log_dir}; pass an explicit ckpt_path")
        return str(found)
    if not Path(ckpt_path).exists():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist")
    return ckpt_path


def build(cfg: DictConfig):
    """Everything but the fit: (trainer, module, datamodule)."""
    from arlopti.learner.module import GRPOModule
    from arlopti.models import load_tokenizer

    L.seed_everything(cfg.seed, workers=True)
    run = run_config(cfg)
    validate_run(run, world_size(cfg))
    tokenizer = load_tokenizer(run.model.name_or_path, run.model.tiny.vocab_size)
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer)
    module = GRPOModule(run, tokenizer=tokenizer, total_rollout_steps=cfg.get("rollout_steps"))
    callbacks = instantiate_dict(cfg.get("callbacks"))
    loggers = instantiate_dict(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    return trainer, module, datamodule


def train(cfg: DictConfig) -> dict:
    """Fit and return the summary dict (also written to ``<output_dir>/summary.json``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer, module, datamodule = build(cfg)
    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), cfg)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    summary = next((cb.summary(module) for cb in trainer.callbacks if hasattr(cb, "summary")), {})
    return {"summary": summary, "trainer": trainer, "module": module}


__all__ = ["ConfigError", "build", "run_config", "train"]
