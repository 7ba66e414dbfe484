"""The run's composed config to every logger, once, at the start of training (rank 0).

The text is ``config_file`` (Hydra's ``<run dir>/.hydra/config.yaml``, the config as composed,
command-line overrides included), **resolved** (``run_name`` as the folder's name, not its
``${run_label:...}`` formula; the text as saved if it cannot be resolved), when it exists, else the
learner's hyper-parameters (the typed run config and the data identity) as YAML, e.g. when
``train()`` is called without Hydra's runtime. Each logger gets it in its native form
(:func:`arlopti.learner.step_logging.write_config`).

It also tags each logger with the run's ``seed`` and ``task_name`` (read from that config), which the
HPARAMS tab lists first with the algorithm (:func:`arlopti.learner.step_logging.hparams_first`), and
writes the run's Custom Scalars layout into each TensorBoard logger (:mod:`arlopti.loggers.tb_layout`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


def config_text(config_file: str | None, hparams) -> str:
    """``config_file``'s config resolved, as YAML, when it is a file (its text as saved when it does
    not resolve), else ``hparams`` dumped as YAML."""
    from omegaconf import OmegaConf

    if config_file and Path(config_file).is_file():
        text = Path(config_file).read_text()
        try:
            return OmegaConf.to_yaml(OmegaConf.load(config_file), resolve=True)
        except Exception as err:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra run
            log.debug("config %s does not resolve here (%s): logged as saved", config_file, err)
            return text
    return OmegaConf.to_yaml(OmegaConf.create(dict(hparams or {})))


def run_identity(config_file: str | None) -> dict:
    """``{"seed", "task_name"}`` of the composed config (what it sets of the two)."""
    from omegaconf import OmegaConf

    if not config_file or not Path(config_file).is_file():
        return {}
    cfg = OmegaConf.load(config_file)
    return {k: cfg[k] for k in ("seed", "task_name") if k in cfg and not OmegaConf.is_missing(cfg, k)}


class ConfigToLoggers(Callback):
    """See the module docstring."""

    def __init__(self, config_file: str | None = None):
        self.config_file = config_file

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0 or not trainer.loggers:
            return
        from arlopti.learner.step_logging import IDENTITY_ATTR, write_config

        identity = run_identity(self.config_file)
        for logger in trainer.loggers:
            setattr(logger, IDENTITY_ATTR, identity)
        write_config(trainer.loggers, config_text(self.config_file, getattr(pl_module, "hparams", {})))
        from arlopti.loggers.tb_layout import write_run_layout

        write_run_layout(trainer, pl_module)  # TensorBoard's Custom Scalars page: reward first (loggers/tb_layout.py)
