"""Train: ``python train.py experiment=kk_lopti`` (see README and configs/)."""

import os
import sys
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import arlopti  # noqa: E402,F401  (registers the config schemas and resolvers before Hydra composes)


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from arlopti.config import check_overrides
    from arlopti.train import train

    check_overrides(HydraConfig.get().overrides.task)  # this job's overrides (a --multirun job's too)
    train(cfg)


if __name__ == "__main__":
    from arlopti.cli import check_command_line

    check_command_line(sys.argv[1:])
    main()
