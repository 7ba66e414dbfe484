"""Train: ``python train.py experiment=kk_lopti`` (see README and configs/).

The job returns ``optimized_metric``'s value (a sweeper's objective: ``python train.py -m
hparams_search=kk_ar_lopti_optuna``). A failure prints one line and exits 1
(:mod:`arlopti.entry.failures`; the traceback with ``HYDRA_FULL_ERROR=1``).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from arlopti.config.compose import prepare
from arlopti.entry.failures import cli_task

CONFIG_DIR = prepare(Path(__file__).resolve().parent / "configs")  # sets PROJECT_ROOT; schemas registered


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train.yaml")
@cli_task
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from arlopti.config import check_overrides
    from arlopti.entry.cluster import stop_sweep_if_interrupted
    from arlopti.entry.train import train

    check_overrides(HydraConfig.get().overrides.task)  # this job's overrides (a --multirun job's too)
    out = train(cfg)
    stop_sweep_if_interrupted(out["module"])  # Ctrl-C in a sweep stops the sweep, not only this job
    return out["objective"]


if __name__ == "__main__":
    from arlopti.entry.cli import prepare_command_line

    sys.argv[1:] = prepare_command_line(sys.argv[1:], "train.yaml")  # --help, output_dir=, unknown keys and types
    main()
