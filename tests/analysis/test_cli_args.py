"""AR's α and Lopti's η of the analysis and study commands come from the algorithm config, written once
(issue 44 item 3: 0.3 and 0.5 were restated in six and seven places)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from arlopti.analysis.cli_args import PAPER_ALGORITHM, fill_method_args, paper_settings
from arlopti.config import LoptiConfig

REPO = Path(__file__).resolve().parents[2]


def test_the_defaults_are_the_algorithm_configs():
    from omegaconf import OmegaConf

    ar = OmegaConf.load(REPO / "configs" / "algorithm" / "ar.yaml")
    assert paper_settings() == (ar.ar_alpha, LoptiConfig().eta)  # AR's file, the schema's η
    assert PAPER_ALGORITHM == "ar_lopti" and "ar_alpha" not in OmegaConf.load(REPO / "configs" / "algorithm" /
                                                                             "ar_lopti.yaml")


def test_a_changed_config_changes_every_commands_default(tmp_path):
    """Read, not restated: a config folder whose ar.yaml says 0.2 gives 0.2."""
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    ar = configs / "algorithm" / "ar.yaml"
    ar.write_text(ar.read_text().replace("ar_alpha: 0.3", "ar_alpha: 0.2"))
    assert paper_settings(configs) == (0.2, LoptiConfig().eta)


@pytest.mark.parametrize("command", ["update-direction", "compare-methods", "reproduce"])
def test_left_out_means_the_configs_and_given_means_given(command):
    from arlopti.analysis.__main__ import build_parser

    args = build_parser().parse_args([command])
    assert (args.alpha, args.eta) == (None, None)
    assert (fill_method_args(args).alpha, args.eta) == paper_settings()
    args = build_parser().parse_args([command, "--alpha", "0.1", "--eta", "0.4"])
    assert (fill_method_args(args).alpha, args.eta) == (0.1, 0.4)


def test_the_studys_fallback_is_the_same():
    """A study of methods without AR or Lopti records the config's α and η (shared_settings)."""
    from arlopti.config import AlgorithmConfig
    from arlopti.study.mechanism import shared_settings

    alpha, eta, _ = shared_settings({"grpo": AlgorithmConfig()})
    assert (alpha, eta) == paper_settings()
