"""Build everything a run needs from a composed Hydra config, then fit.

``train(cfg)`` is what ``python train.py`` calls; tests call it with a composed config.
Order: seed → typed run config → callbacks, loggers and Trainer → the run config validated once,
against the Trainer's real world size → tokenizer → DataModule → learner → ``fit`` (resuming
from ``ckpt_path`` when given).

Resuming (``ckpt_path``): ``last`` = this run's ``checkpoints/last.ckpt``, else the newest
``last.ckpt`` of the same ``task_name`` and ``run_name`` (see :mod:`arlopti.resume`); ``auto`` = this run's
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

import hydra
import lightning.pytorch as L
from omegaconf import DictConfig, OmegaConf

from arlopti.config import ConfigError, RunConfig, from_dict, saved_run_as_current, validate_once

log = logging.getLogger(__name__)


def run_config(cfg: DictConfig) -> RunConfig:
    """The typed :class:`RunConfig` of a composed config: its ``algorithm``, ``optim``, ``sizes``,
    ``model`` and ``rollout`` nodes (Hydra has checked them against the registered schemas; a node
    composed without one is checked here, unknown keys being errors)."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(RunConfig)]
    return from_dict(RunConfig, {n: OmegaConf.to_container(cfg[n], resolve=True) for n in names if n in cfg}, "")


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


def resolve_ckpt_path(ckpt_path: str | None, cfg: DictConfig | None) -> str | None:
    """The checkpoint ``ckpt_path`` names (see the module docstring), checked to be complete:
    :func:`arlopti.resume.resolve_ckpt_path` with this run's directories read from ``cfg``
    (``paths.output_dir``, ``paths.log_dir``, ``task_name``, ``run_name``; only for ``auto`` and
    ``last``, so an explicit path needs no config)."""
    from arlopti.resume import resolve_ckpt_path as resolve

    if ckpt_path not in ("auto", "last"):
        return resolve(ckpt_path)
    try:
        output_dir = cfg.paths.output_dir
    except Exception:  # output_dir needs a Hydra runtime
        output_dir = None
    return resolve(ckpt_path, output_dir=output_dir, log_dir=cfg.paths.log_dir, task_name=cfg.task_name,
                   run_name=cfg.run_name)


def check_resume_compatible(ckpt: str, run, allow_mismatch: bool = False, data: dict | None = None) -> None:
    """Refuse a checkpoint whose saved run config differs from ``run`` (lists every differing key),
    or whose saved data identity (``hyper_parameters.data``, :func:`data_signature`) differs from
    ``data``: resuming K&K weights and sampler state for math training is a mismatch too. A
    checkpoint saved before the data identity was recorded is resumed with a warning."""
    from dataclasses import asdict

    from arlopti.callbacks.checkpointing import config_mismatches, load_checkpoint_metadata

    meta = load_checkpoint_metadata(ckpt)
    hparams = meta.get("hyper_parameters") or {}
    saved = hparams.get("run")
    if saved is None:
        raise ConfigError(f"checkpoint {ckpt} has no saved run config (hyper_parameters.run): not an arlopti "
                          "training checkpoint")
    # an older checkpoint: keys removed since are ignored, keys added since compare as their default
    diffs = config_mismatches(saved_run_as_current(saved), asdict(run))
    if data is not None:
        saved_data = hparams.get("data")
        if saved_data is None:
            log.warning("checkpoint %s records no data config (saved before it was recorded): cannot check that "
                        "it was trained on the same data (%s)", ckpt, data.get("_target_"))
        else:
            diffs += config_mismatches({"data": dict(saved_data)}, {"data": dict(data)})
    if not diffs:
        return
    listing = "\n  ".join(diffs)
    if allow_mismatch:
        log.warning("resuming from %s with a different config (allow_config_mismatch=true):\n  %s", ckpt, listing)
        return
    raise ConfigError(f"checkpoint {ckpt} was saved with a different config:\n  {listing}\n"
                      "Resume with the same settings, or pass allow_config_mismatch=true to resume anyway "
                      "(model.* differences will still fail to load).")


#: The keys of a ``data`` config that say which data a run trains on (its identity; sizes, limits
#: and validation settings are left out): recorded in checkpoints and compared on resume.
DATA_IDENTITY_KEYS = ("_target_", "source", "generator_seed", "data_dir", "train_file", "dataset_name",
                      "template", "train_people", "task", "prompt_key", "answer_key", "system_prompt",
                      "chat_template", "val_fraction", "split_seed")


def data_signature(data_cfg) -> dict:
    """The identity of a ``data`` config (:data:`DATA_IDENTITY_KEYS` that it sets, resolved)."""
    if data_cfg is None:
        return {}
    d = OmegaConf.to_container(data_cfg, resolve=True) if isinstance(data_cfg, DictConfig) else dict(data_cfg)
    return {k: (list(d[k]) if isinstance(d[k], (list, tuple)) else d[k]) for k in DATA_IDENTITY_KEYS if k in d}


def finished_reason(ckpt: str, rollout_steps: int | None, max_epochs: int | None) -> str | None:
    """Why a run resumed from ``ckpt`` would have nothing left to do, or None.

    Done = the checkpoint's ``arlopti.rollout_step`` >= ``rollout_steps``, or its epochs >=
    ``max_epochs`` (completed epochs, plus the current one when the checkpoint was saved on that
    epoch's last batch, as the final save is). Lightning's stop check only runs after a step, so
    resuming such a run would otherwise train one more step and save it.
    """
    from arlopti.callbacks.checkpointing import load_checkpoint_metadata

    meta = load_checkpoint_metadata(ckpt)
    step = int((meta.get("arlopti") or {}).get("rollout_step", 0))
    if rollout_steps is not None and step >= int(rollout_steps):
        return f"checkpoint is at rollout step {step} and rollout_steps={rollout_steps}"
    if max_epochs is not None and int(max_epochs) >= 0:
        fit = (meta.get("loops") or {}).get("fit_loop") or {}
        epochs = int(((fit.get("epoch_progress") or {}).get("current") or {}).get("completed", 0))
        batches = fit.get("epoch_loop.batch_progress") or {}
        current = batches.get("current") or {}
        if batches.get("is_last_batch") and current.get("processed", 0) >= max(1, current.get("ready", 0)):
            epochs = max(epochs, int(meta.get("epoch", epochs)) + 1)
        if epochs >= int(max_epochs):
            return (f"checkpoint has finished {epochs} epoch(s) (rollout step {step}) and "
                    f"trainer.max_epochs={max_epochs}")
    return None


def _check_strategy(trainer, module, run) -> None:
    """Start-up checks that need the built module: under FSDP2, that the decoder-layer class exists."""
    from lightning.pytorch.strategies import ModelParallelStrategy

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
    callbacks = instantiate_dict(cfg.get("callbacks"))
    for cb in callbacks:  # a checkpoint folder that cannot be written: now, not at the first save
        if hasattr(cb, "check_writable"):
            cb.check_writable()
    loggers = instantiate_dict(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    # The one validation of a start, with the real world size, before any model is loaded;
    # GRPOModule.__init__ and .setup see it done and skip theirs.
    validate_once(run, int(trainer.num_devices) * int(trainer.num_nodes))
    log.info("algorithm: %s (algorithm.ar_alpha=%s, algorithm.lopti.enabled=%s)", run.algorithm.label,
             run.algorithm.ar_alpha, run.algorithm.lopti.enabled)
    from arlopti.learner.lora import hydra_choice, note_fidelity

    note_fidelity(run.model.lora, hydra_choice("fidelity"))  # LoRA + fidelity=official: allowed, noted
    task_options = OmegaConf.to_container(cfg.tasks, resolve=True) if cfg.get("tasks") else {}
    check_task_options(task_options)
    tokenizer = load_tokenizer(run.model.name_or_path, run.model.tiny.vocab_size)
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer)
    data_task = getattr(datamodule, "task_name", None)
    if data_task and task_options.get(data_task) is None:  # data=prompts without task=custom: say so now
        check_task_options({}, required=(data_task,))
    module = GRPOModule(run, tokenizer=tokenizer, total_rollout_steps=cfg.get("rollout_steps"),
                        task_options=task_options, data_signature=data_signature(cfg.get("data")))
    _check_strategy(trainer, module, run)
    return trainer, module, datamodule


def train(cfg: DictConfig) -> dict:
    """Fit and return the summary dict (also written to ``<output_dir>/summary.json``).

    A resume from a checkpoint that already reached ``rollout_steps`` or ``trainer.max_epochs``
    builds and trains nothing: it logs why and returns ``{"finished": <reason>, ...}``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from arlopti.utils.console import quiet_console

    quiet_console()  # Lightning's lines once (Hydra's console + train.log), no adverts (arlopti/utils/console.py)
    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), cfg)
    if ckpt is not None:
        reason = finished_reason(ckpt, cfg.get("rollout_steps"), (cfg.get("trainer") or {}).get("max_epochs"))
        if reason is not None:
            log.info("nothing to do: %s is already finished (%s); no step is run and no checkpoint written. "
                     "Raise rollout_steps / trainer.max_epochs to train further.", ckpt, reason)
            return {"summary": {}, "trainer": None, "module": None, "finished": reason, "ckpt_path": ckpt}
    trainer, module, datamodule = build(cfg)
    if ckpt is not None:
        check_resume_compatible(ckpt, module.cfg, bool(cfg.get("allow_config_mismatch", False)),
                                data=data_signature(cfg.get("data")))
        log.info("resuming from %s", ckpt)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    summary = next((cb.summary(module) for cb in trainer.callbacks if hasattr(cb, "summary")), {})
    return {"summary": summary, "trainer": trainer, "module": module}


__all__ = ["ConfigError", "build", "check_resume_compatible", "data_signature", "finished_reason",
           "resolve_ckpt_path", "run_config", "train"]
