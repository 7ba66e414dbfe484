"""Evaluate: ``python eval.py model=<name or path> eval=math_suite`` or ``ckpt_path=<ckpt> eval=kk_suite``.

A failure prints one line and exits 1 (:mod:`arlopti.entry.failures`; the traceback with ``HYDRA_FULL_ERROR=1``).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from arlopti.config.compose import prepare
from arlopti.entry.failures import cli_task

CONFIG_DIR = prepare(Path(__file__).resolve().parent / "configs", "eval.yaml")  # sets PROJECT_ROOT


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval.yaml")
@cli_task
def main(cfg: DictConfig) -> None:
    from arlopti.entry.evaluate import evaluate

    evaluate(cfg)


if __name__ == "__main__":
    from arlopti.entry.cli import prepare_command_line

    sys.argv[1:] = prepare_command_line(sys.argv[1:], "eval.yaml")  # --help, output_dir=, unknown keys and types
    main()
