"""Build everything a run needs from a composed Hydra config, then fit.

``train(cfg)`` is what ``python train.py`` calls; tests call it with a composed config.
Order: the user's plugin modules (``plugins``) → seed → typed run config → callbacks, loggers and Trainer → the run config validated once,
against the Trainer's real world size → the checkpoint resumed from checked against it → tokenizer
→ DataModule → learner → ``fit`` (resuming from ``ckpt_path`` when given). ``train`` returns the
value of ``optimized_metric`` too (:func:`objective`), which ``python train.py`` hands to a sweeper.

Resuming (``ckpt_path``): ``last`` = this run's ``checkpoints/last.ckpt``, else the newest
``last.ckpt`` of the same ``task_name`` and ``run_name`` (see :mod:`arlopti.checkpoints.resume`); ``auto`` = this run's
``checkpoints/last.ckpt`` if there is one, else a fresh start (for job scripts that pass a fixed
``hydra.run.dir`` and are requeued); a run directory = its ``checkpoints/last.ckpt``; or a
checkpoint file / FSDP2 checkpoint folder (:func:`resume_from`). The checkpoint is checked before any model
loads (:func:`arlopti.checkpoints.resume.finished_reason`, :func:`arlopti.checkpoints.resume.check_resume_compatible`): a
truncated file is named, and a checkpoint whose run config (algorithm, optim, sizes, model,
rollout) differs from this run's is refused with the differing keys unless
``allow_config_mismatch=true``. The rollout callback the learner needs is wired here
(:func:`attach_rollout_callback`), not by the learner.
"""

from __future__ import annotations

import logging
import os

import hydra
import lightning.pytorch as L
from omegaconf import DictConfig, OmegaConf

from arlopti.config import ConfigError, RunConfig, from_dict, validate_once
from arlopti.checkpoints.resume import (RESOLVED_ENV, check_checkpoint_strategy, check_resume_compatible,
                                        finished_reason, inherited_answer, resolve_ckpt_path)

log = logging.getLogger(__name__)


def run_config(cfg: DictConfig) -> RunConfig:
    """The typed :class:`RunConfig` of a composed config: its ``algorithm``, ``optim``, ``sizes``,
    ``model`` and ``rollout`` nodes (Hydra has checked them against the registered schemas; a node
    composed without one is checked here, unknown keys being errors)."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(RunConfig)]
    return from_dict(RunConfig, {n: OmegaConf.to_container(cfg[n], resolve=True) for n in names if n in cfg}, "")


def import_plugins(specs) -> list[str]:
    """Import the user's modules that register methods into arlopti's registries (``plugins``: import paths
    ``pkg.mod`` or files ``path/to/file.py``, docs/plugins.md), before the run config is checked, so that
    ``algorithm.policy_loss``, ``algorithm.token_method.name`` and ``algorithm.advantage`` may name what
    they register. The user named them, as they name a reward function. Returns the specs imported."""
    from arlopti.tasks.user_code import UserCodeError, load_module

    if specs is None:
        return []
    names = [specs] if isinstance(specs, str) else list(specs)
    for spec in names:
        if not isinstance(spec, str) or not spec.strip() or ":" in spec:
            raise ConfigError(f"plugins: {spec!r} is not a module: give an import path (my_pkg.my_losses) or a "
                              "file (path/to/my_losses.py)")
        is_file = spec.endswith(".py") or "/" in spec or os.sep in spec
        try:
            load_module(spec.strip(), is_file, spec)
        except UserCodeError as err:
            raise ConfigError(f"plugins: {err}") from err
    return names


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


def run_dirs(cfg: DictConfig | None) -> dict:
    """This run's directories, as :func:`arlopti.checkpoints.resume.resolve_ckpt_path` takes them, read from
    ``cfg`` (``paths.output_dir``, ``paths.log_dir``, ``task_name``, ``run_name``); ``{}`` without a
    config (an explicit path needs none). ``output_dir`` is None without a Hydra runtime."""
    if cfg is None:
        return {}
    try:
        output_dir = cfg.paths.output_dir
    except Exception:  # output_dir needs a Hydra runtime
        output_dir = None
    return dict(output_dir=output_dir, log_dir=cfg.paths.log_dir, task_name=cfg.task_name, run_name=cfg.run_name)


def resume_from(cfg: DictConfig) -> str | None:
    """The checkpoint this run resumes from (``cfg.ckpt_path`` resolved by :mod:`arlopti.checkpoints.resume`),
    exported as :data:`~arlopti.checkpoints.resume.RESOLVED_ENV` for the ranks Lightning launches, which take
    rank 0's answer (:func:`~arlopti.checkpoints.resume.inherited_answer`) rather than search again."""
    ckpt_path = cfg.get("ckpt_path")
    dirs = run_dirs(cfg) if ckpt_path in ("auto", "last") else {}
    ckpt = resolve_ckpt_path(ckpt_path, **dirs, inherited=inherited_answer(os.environ))
    if ckpt is not None:
        os.environ[RESOLVED_ENV] = ckpt
    return ckpt


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


def _check_strategy(trainer, module, run) -> None:
    """Start-up checks that need the built module: under FSDP2, that the decoder-layer class exists."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if isinstance(trainer.strategy, ModelParallelStrategy):
        from arlopti.learner.sharding import decoder_layer_class

        decoder_layer_class(module.policy.hf, run.model.decoder_layer_class)


def attach_rollout_callback(trainer: L.Trainer, group_size: int, task_options: dict, env=None) -> None:
    """Give ``trainer`` the :class:`~arlopti.callbacks.rollout.RolloutCallback` the learner cannot
    run without, unless it has one. It goes where Lightning would put a module's own callback:
    after the other callbacks, before the checkpoint callbacks (which Lightning keeps last).
    ``env``: the run's environment settings (``task.*``, :class:`~arlopti.config.schema.EnvConfig`)."""
    from lightning.pytorch.callbacks import Checkpoint

    from arlopti.callbacks.rollout import RolloutCallback

    if any(isinstance(c, RolloutCallback) for c in trainer.callbacks):
        return
    at = next((i for i, c in enumerate(trainer.callbacks) if isinstance(c, Checkpoint)), len(trainer.callbacks))
    trainer.callbacks.insert(at, RolloutCallback(group_size=group_size, task_kwargs=dict(task_options), env=env))


def trainer_precision(trainer_cfg: DictConfig) -> str:
    """``trainer.precision`` with ``auto`` resolved (:mod:`arlopti.utils.precision`; the measured GEMM rates
    cached in the project's cache folder); the choice, with the two rates where measured, is logged."""
    from arlopti.models.loading import cache_dir
    from arlopti.utils.precision import RATES_FILE, resolve_precision

    precision, why = resolve_precision(trainer_cfg.get("precision", "32-true"), trainer_cfg.get("accelerator"),
                                       cache_file=cache_dir() / RATES_FILE)
    if why is not None:
        log.info("trainer.precision=auto: %s, because %s", precision, why)
    return precision


def build(cfg: DictConfig, ckpt: str | None = None):
    """Everything but the fit: (trainer, module, datamodule). ``ckpt`` (the checkpoint this run
    resumes from) is checked against the run config before any model loads."""
    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import load_tokenizer
    from arlopti.rollout.turns import build_turn_loop
    from arlopti.tasks.base import check_task_options
    from arlopti.tasks.env.loading import env_config

    L.seed_everything(cfg.seed, workers=True)
    run = run_config(cfg)
    callbacks = instantiate_dict(cfg.get("callbacks"))
    for cb in callbacks:  # a checkpoint folder that cannot be written: now, not at the first save
        if hasattr(cb, "check_writable"):
            cb.check_writable()
    loggers = instantiate_dict(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False,
                                      precision=trainer_precision(cfg.trainer))
    from arlopti.entry.cluster import check_multirun_ranks

    check_multirun_ranks(trainer)  # a sweep's job cannot start ranks itself
    # The one validation of a start, with the real world size, before any model is loaded;
    # GRPOModule.__init__ and .setup see it done and skip theirs.
    validate_once(run, int(trainer.num_devices) * int(trainer.num_nodes))
    data_identity = data_signature(cfg.get("data"))
    if ckpt is not None:  # an incompatible checkpoint is refused now, before the policy and the reference load
        check_resume_compatible(ckpt, run, bool(cfg.get("allow_config_mismatch", False)), data=data_identity)
        check_checkpoint_strategy(ckpt, trainer.strategy)  # an FSDP2 folder needs trainer=fsdp
        log.info("resuming from %s", ckpt)
    log.info("algorithm: %s (algorithm.ar_alpha=%s, algorithm.lopti.enabled=%s)", run.algorithm.label,
             run.algorithm.ar_alpha, run.algorithm.lopti.enabled)
    from arlopti.models.lora import hydra_choice, note_fidelity
    from arlopti.models.lora_serving import check_adapter_servable

    check_adapter_servable(run.model.lora, run.rollout)  # before vLLM refuses it at the first sync
    note_fidelity(run.model.lora, hydra_choice("fidelity"))  # LoRA + fidelity=official: allowed, noted
    task_options = OmegaConf.to_container(cfg.tasks, resolve=True) if cfg.get("tasks") else {}
    env = env_config(OmegaConf.to_container(cfg.task, resolve=True) if cfg.get("task") else None)  # task.env*
    check_task_options(task_options)
    tokenizer = load_tokenizer(run.model.name_or_path, run.model.tiny.vocab_size)
    build_turn_loop(run.rollout, env, tokenizer)  # task.env imported and probed now, not at the first step
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer)
    data_task = getattr(datamodule, "task_name", None)
    if data_task and task_options.get(data_task) is None:  # data=prompts without task=custom: say so now
        check_task_options({}, required=(data_task,))
    module = GRPOModule(run, tokenizer=tokenizer, total_rollout_steps=cfg.get("rollout_steps"),
                        task_options=task_options, data_signature=data_identity)
    _check_strategy(trainer, module, run)
    attach_rollout_callback(trainer, run.sizes.group_size, task_options, env)
    return trainer, module, datamodule


def train(cfg: DictConfig) -> dict:
    """Fit and return ``{"summary", "trainer", "module", "objective"}``: the summary dict (also written
    to ``<output_dir>/summary.json``) and the value of ``optimized_metric`` (:func:`objective`).

    A resume from a checkpoint that already reached ``rollout_steps`` or ``trainer.max_epochs``
    builds and trains nothing: it logs why and returns ``{"finished": <reason>, ...}``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from arlopti.entry.cluster import hand_back_if_preempted, prepare_job
    from arlopti.utils.console import quiet_console

    quiet_console()  # Lightning's lines once (Hydra's console + train.log), no adverts (arlopti/utils/console.py)
    prepare_job(cfg)  # a submitit job: its nodes, its preemption signal (arlopti/entry/cluster.py)
    import_plugins(cfg.get("plugins"))  # the user's methods register before the config names them
    ckpt = resume_from(cfg)
    if ckpt is not None:
        reason = finished_reason(ckpt, cfg.get("rollout_steps"), (cfg.get("trainer") or {}).get("max_epochs"))
        if reason is not None:
            log.info("nothing to do: %s is already finished (%s); no step is run and no checkpoint written. "
                     "Raise rollout_steps / trainer.max_epochs to train further.", ckpt, reason)
            summary = finished_summary(cfg)
            return {"summary": summary, "trainer": None, "module": None, "finished": reason, "ckpt_path": ckpt,
                    "objective": objective(cfg.get("optimized_metric"), None, summary) if summary else None}
    trainer, module, datamodule = build(cfg, ckpt)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    hand_back_if_preempted(module)  # a submitit job stopped by its signal: requeued here (and exits)
    summary = next((cb.summary(module) for cb in trainer.callbacks if hasattr(cb, "summary")), {})
    out = {"summary": summary, "trainer": trainer, "module": module}
    out["objective"] = objective(cfg.get("optimized_metric"), module, summary)
    return out


def finished_summary(cfg: DictConfig) -> dict:
    """The ``summary.json`` this run's folder already holds (a requeued job whose run had finished), or {}."""
    import json
    from pathlib import Path

    folder = run_dirs(cfg).get("output_dir")
    path = Path(folder) / "summary.json" if folder else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def objective(metric: str | None, module, summary: dict) -> float | None:
    """The value of ``optimized_metric`` for a sweeper (None when it is null): the final validation's
    (``summary["eval_last"]``) or else the last rollout step's metric of that name (``summary["end"]``
    without a module: a finished run's ``summary.json``). A name the run never logged is a
    :class:`ConfigError` listing the names it did."""
    if not metric:
        return None
    ctx = getattr(module, "last_step_context", None)
    last_step = getattr(ctx, "metrics", None) or summary.get("end") or {}
    found = {**last_step, **(summary.get("eval_last") or {})}
    if metric not in found:
        names = sorted(k for k in found if k != "rollout_step")
        raise ConfigError(f"optimized_metric={metric!r}: this run logged no such metric; the final validation and "
                          f"the last rollout step have: {', '.join(names)}")
    return float(found[metric])


__all__ = ["ConfigError", "attach_rollout_callback", "build", "data_signature", "objective", "resume_from",
           "import_plugins", "run_config", "run_dirs", "train"]
