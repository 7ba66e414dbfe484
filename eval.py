"""Evaluate: ``python eval.py model=<name or path> eval=math_suite`` or ``ckpt_path=<ckpt> eval=kk_suite``."""

import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import arlopti  # noqa: E402,F401  (registers the config schemas and resolvers before Hydra composes)


@hydra.main(version_base="1.3", config_path="configs", config_name="eval.yaml")
def main(cfg: DictConfig) -> None:
    from arlopti.evaluate import evaluate

    evaluate(cfg)


if __name__ == "__main__":
    import sys

    from arlopti.cli import check_command_line

    check_command_line(sys.argv[1:])
    main()
