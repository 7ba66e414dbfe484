"""The run's composed config to every logger, once, at the start of training (rank 0).

The text is ``config_file`` (Hydra's ``<run dir>/.hydra/config.yaml``, the config as composed,
command-line overrides included) when it exists, else the learner's hyper-parameters (the typed
run config and the data identity) as YAML, e.g. when ``train()`` is called without Hydra's
runtime. Each logger gets it in its native form (:func:`arlopti.learner.step_logging.write_config`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


def config_text(config_file: str | None, hparams) -> str:
    """``config_file``'s text when it is a file, else ``hparams`` dumped as YAML."""
    if config_file and Path(config_file).is_file():
        return Path(config_file).read_text()
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(dict(hparams or {})))


class ConfigToLoggers(Callback):
    """See the module docstring."""

    def __init__(self, config_file: str | None = None):
        self.config_file = config_file

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0 or not trainer.loggers:
            return
        from arlopti.learner.step_logging import write_config

        write_config(trainer.loggers, config_text(self.config_file, getattr(pl_module, "hparams", {})))
