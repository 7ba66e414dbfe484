"""The ``arlopti`` console script: every subcommand listed and its ``--help`` working, each running the entry
point it names, a bad setting one line with exit status 1, and ``python -m arlopti.export`` answering with
the new command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arlopti.entry import command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("arlopti")


def _run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}  # the one-line report, not the trace
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.process


def test_the_console_script_is_installed_and_lists_every_subcommand():
    assert SCRIPT.is_file(), f"{SCRIPT}: `pip install -e .` (make install) installs the arlopti script"
    done = _run(str(SCRIPT), "--help")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(command.SUBCOMMANDS)
    for verb in ("train", "eval", "export", "serve", "analysis", "study", "prepare", "preview"):
        assert verb in listed


@pytest.mark.parametrize("name", [n for n, (t, _) in command.SUBCOMMANDS.items() if not t.endswith(".py")])
def test_every_module_subcommands_help_names_it_and_has_no_markup(name, capsys):
    """Issue 54 item 5: ``usage: arlopti <sub>``, never ``python -m arlopti...``, no reST roles or literals."""
    assert command.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: arlopti {name} "), out[:200]
    assert "python -m arlopti" not in out and "``" not in out and ":func:`" not in out and ":mod:`" not in out
    assert argparse.ArgumentParser.format_help.__name__ == "format_help"  # argparse is itself again
    assert argparse.ArgumentParser.format_help.__qualname__ == "ArgumentParser.format_help"


def test_a_usage_error_names_the_subcommand(capsys):
    assert command.main(["compare"]) == 2
    assert capsys.readouterr().err.startswith("usage: arlopti compare ")


def test_compare_is_described_as_taking_two_runs(capsys):
    assert "exactly two runs" in command.SUBCOMMANDS["compare"][1]
    command.main(["--help"])
    assert "exactly two runs" in capsys.readouterr().out


def test_plain_help_drops_the_markup():
    text = "``python -m arlopti.eval.compare A.json`` (:func:`arlopti.x.y`, :mod:`~m`) python train.py a=1. Examples::"
    assert command.plain_help(text) == \
        "arlopti compare A.json (arlopti.x.y, m) arlopti train a=1. Examples:"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train", "eval"])
def test_train_and_eval_help_is_the_page_not_hydras_dump(name):
    done = _run(str(SCRIPT), name, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: arlopti {name} ") and "== Config ==" not in done.stdout


@pytest.mark.process


def test_an_unknown_subcommand_is_named():
    done = _run(str(SCRIPT), "trian")
    assert done.returncode == 2 and "unknown subcommand 'trian'" in done.stderr and "arlopti --help" in done.stderr


@pytest.mark.process


def test_a_bad_setting_is_one_line_with_status_1(capsys):
    assert command.main(["study", "toy", "--steps", "-1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ConfigError: --steps -1")
    done = _run(str(SCRIPT), "train", "algorithm.lopti.enabled=no")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "algorithm.lopti.enabled" in lines[0], done.stderr


@pytest.mark.process


def test_the_old_export_module_answers_with_the_new_command():
    done = _run(sys.executable, "-m", "arlopti.export", "--help")
    assert done.returncode == 0, done.stderr
    assert "`arlopti export`" in done.stderr and "ckpt" in done.stdout


def test_the_scripts_it_runs_are_the_repositorys():
    assert (command.repo_root() / "train.py").is_file() and (command.repo_root() / "configs").is_dir()
