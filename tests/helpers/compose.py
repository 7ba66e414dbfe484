"""Composed configs for tests: the checkout's ``train.yaml`` / ``eval.yaml`` with the run's folders under a
temporary path (:func:`arlopti.config.compose.compose`, the project's one compose set-up)."""

from __future__ import annotations

from pathlib import Path

from arlopti.config.compose import compose

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def compose_train(overrides: list[str], out: Path):
    return compose([f"paths.output_dir={out}", f"paths.log_dir={out}/logs", *overrides], config_dir=CONFIGS)


def compose_eval(tmp_path: Path, overrides: list[str]):
    return compose([f"paths.log_dir={tmp_path}/logs", f"output_file={tmp_path}/eval_results.json", *overrides],
                   config_name="eval.yaml", config_dir=CONFIGS)
