"""Build everything a run needs from a composed Hydra config, then fit.

``train(cfg)`` is what ``python train.py`` calls; tests call it with a composed config.
Order: seed → typed, validated run config → tokenizer → DataModule → learner → callbacks and
loggers → Trainer → (the sizes re-validated against the Trainer's real world size) → ``fit``
(resuming from ``ckpt_path`` when given).

Resuming (``ckpt_path``): ``last`` = this run's ``checkpoints/last.ckpt``, else the newest
``last.ckpt`` of the same ``task_name`` (see
:func:`arlopti.callbacks.checkpointing.find_last_checkpoint`); ``auto`` = this run's
``checkpoints/last.ckpt`` if there is one, else a fresh start (for job scripts that pass a fixed
``hydra.run.dir`` and are requeued); a run directory = its ``checkpoints/last.ckpt``; or a
checkpoint file / FSDP2 checkpoint folder. The checkpoint is
checked first: a truncated file is named, and a checkpoint whose run config (algorithm, optim,
sizes, model, rollout) differs from this run's is refused with the differing keys unless
``allow_config_mismatch=true``.
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
    """Processes the trainer config asks for, when it can be told without building the Trainer.

    ``devices: auto`` / ``-1`` count as 1 here; :func:`build` re-checks with the real number.
    """
    devices = cfg.trainer.get("devices", 1)
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        n = devices
    elif isinstance(devices, str) and "," in devices:
        n = len([d for d in devices.split(",") if d.strip()])
    elif OmegaConf.is_list(devices) or isinstance(devices, (list, tuple)):
        n = len(devices)
    else:
        n = 1
    return n * int(cfg.trainer.get("num_nodes", 1))


def instantiate_dict(node: DictConfig | None) -> list:
    """Instantiate every ``_target_`` entry of a dict-style group (callbacks, loggers)."""
    if not node:
        return []
    return [hydra.utils.instantiate(v) for v in node.values() if isinstance(v, DictConfig) and "_target_" in v]


_RESOLVED_ENV = "ARLOPTI_RESOLVED_CKPT"  # rank 0's answer for ckpt_path=last, inherited by the ranks it launches


def resolve_ckpt_path(ckpt_path: str | None, cfg: DictConfig) -> str | None:
    """The checkpoint ``ckpt_path`` names (see the module docstring), checked to be complete."""
    from arlopti.callbacks.checkpointing import _last_in, find_last_checkpoint, validate_checkpoint

    if ckpt_path in (None, ""):
        return None
    ckpt_path = str(ckpt_path)
    if ckpt_path == "auto":
        try:
            own = _last_in(Path(cfg.paths.output_dir) / "checkpoints")
        except Exception:  # output_dir needs a Hydra runtime
            own = None
        if own is None:
            log.info("ckpt_path=auto: no checkpoint in this run directory; starting from scratch")
            return None
        path = own
    elif ckpt_path == "last":
        inherited = os.environ.get(_RESOLVED_ENV)
        if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
            return inherited  # a rank Lightning started: use what rank 0 found, not a fresh search
        found = find_last_checkpoint(cfg)
        if found is None:
            try:
                own = f"{cfg.paths.output_dir}/checkpoints"
            except Exception:
                own = "<this run>/checkpoints"
            raise FileNotFoundError(
                f"ckpt_path=last: no last.ckpt under {own} nor under any earlier run of "
                f"task_name={cfg.task_name} in {cfg.paths.log_dir}/{cfg.task_name}/runs; pass an explicit ckpt_path")
        path = found
    else:
        path = Path(ckpt_path)
        if not path.exists():
            raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist")
        if path.is_dir() and (path / "checkpoints").is_dir():  # a run directory
            found = _last_in(path / "checkpoints")
            if found is None:
                raise FileNotFoundError(f"ckpt_path={ckpt_path!r} is a run directory without checkpoints/last.ckpt")
            path = found
    validate_checkpoint(path)
    os.environ[_RESOLVED_ENV] = str(path)
    return str(path)


def check_resume_compatible(ckpt: str, run, allow_mismatch: bool = False) -> None:
    """Refuse a checkpoint whose saved run config differs from ``run`` (lists every differing key)."""
    from dataclasses import asdict

    from arlopti.callbacks.checkpointing import config_mismatches, load_checkpoint_metadata

    meta = load_checkpoint_metadata(ckpt)
    saved = (meta.get("hyper_parameters") or {}).get("run")
    if saved is None:
        raise ConfigError(f"checkpoint {ckpt} has no saved run config (hyper_parameters.run): not an arlopti "
                          "training checkpoint")
    diffs = config_mismatches(saved, asdict(run))
    if not diffs:
        return
    listing = "\n  ".join(diffs)
    if allow_mismatch:
        log.warning("resuming from %s with a different config (allow_config_mismatch=true):\n  %s", ckpt, listing)
        return
    raise ConfigError(f"checkpoint {ckpt} was saved with a different config:\n  {listing}\n"
                      "Resume with the same settings, or pass allow_config_mismatch=true to resume anyway "
                      "(model.* differences will still fail to load).")


def _check_strategy(trainer, module, run) -> None:
    """Start-up checks that need the built Trainer: sizes against the real world size, FSDP2 layers."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    validate_run(run, int(trainer.num_devices) * int(trainer.num_nodes))
    if isinstance(trainer.strategy, ModelParallelStrategy):
        from arlopti.learner.sharding import decoder_layer_class

        decoder_layer_class(module.policy.hf, run.model.decoder_layer_class)


def build(cfg: DictConfig):
    """Everything but the fit: (trainer, module, datamodule)."""
    from arlopti.learner.module import GRPOModule
    from arlopti.models import load_tokenizer
    from arlopti.tasks.base import check_task_options

    L.seed_everything(cfg.seed, workers=True)
    run = run_config(cfg)
    validate_run(run, world_size(cfg))
    check_task_options(OmegaConf.to_container(cfg.tasks, resolve=True) if cfg.get("tasks") else None)
    tokenizer = load_tokenizer(run.model.name_or_path, run.model.tiny.vocab_size)
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer)
    module = GRPOModule(run, tokenizer=tokenizer, total_rollout_steps=cfg.get("rollout_steps"))
    callbacks = instantiate_dict(cfg.get("callbacks"))
    loggers = instantiate_dict(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    _check_strategy(trainer, module, run)
    return trainer, module, datamodule


def train(cfg: DictConfig) -> dict:
    """Fit and return the summary dict (also written to ``<output_dir>/summary.json``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer, module, datamodule = build(cfg)
    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), cfg)
    if ckpt is not None:
        check_resume_compatible(ckpt, module.cfg, bool(cfg.get("allow_config_mismatch", False)))
        log.info("resuming from %s", ckpt)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    summary = next((cb.summary(module) for cb in trainer.callbacks if hasattr(cb, "summary")), {})
    return {"summary": summary, "trainer": trainer, "module": module}


__all__ = ["ConfigError", "build", "check_resume_compatible", "resolve_ckpt_path", "run_config", "train"]
