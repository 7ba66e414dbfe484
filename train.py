"""Train: ``python train.py experiment=kk_lopti`` (see README and configs/)."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from arlopti.config.compose import prepare

CONFIG_DIR = prepare(Path(__file__).resolve().parent / "configs")  # sets PROJECT_ROOT; schemas registered


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train.yaml")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from arlopti.config import check_overrides
    from arlopti.entry.train import train

    check_overrides(HydraConfig.get().overrides.task)  # this job's overrides (a --multirun job's too)
    train(cfg)


if __name__ == "__main__":
    from arlopti.entry.cli import check_command_line

    check_command_line(sys.argv[1:])
    main()
