"""Every command reports a refused configuration as one line and exit status 1 (issue 33).

Each ``python -m arlopti...`` command is run in a subprocess with a bad argument that raises a
:class:`ConfigError`: exactly one line on stderr, no traceback, exit status 1; with
``HYDRA_FULL_ERROR=1`` the traceback instead (as train.py's, tests/test_clear_failures.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from arlopti.config import ConfigError
from arlopti.config.cli_report import run_command

COMMANDS = {
    "analysis": (["arlopti.analysis", "study", "toy", "--seeds", "1", "--out", "{tmp}/study"],
                 "ConfigError: --seeds 1: seeds per method (a CI over seeds needs at least 2)"),
    "prepare": (["arlopti.data.prepare", "kk", "--train-count", "-1", "--out", "{tmp}/kk"],
                "ConfigError: --train-count -1 --test-count 100: both must be >= 0"),
    "preview": (["arlopti.data.preview", "data=kk", "model=tiny", "+model.bogus=1"],
                "ConfigError: model: unknown key(s) ['bogus']; known keys: "),
    "export": (["arlopti.checkpoints.export", "{tmp}/none.ckpt", "{tmp}/out", "--dtype", "float64"],
               "ConfigError: --dtype='float64': use one of float32, bfloat16, float16"),
}


def run_module(args: list[str], tmp_path, full_error: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    argv = [sys.executable, "-m", *(a.format(tmp=tmp_path) for a in args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def the_line(err: str) -> str:
    """stderr's only line: no traceback, nothing else."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.process
def test_a_config_error_is_one_line_and_exit_status_1(command, tmp_path):
    args, line = COMMANDS[command]
    done = run_module(args, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert the_line(done.stderr).startswith(line)


@pytest.mark.process


def test_hydra_full_error_shows_the_traceback(tmp_path):
    done = run_module(COMMANDS["export"][0], tmp_path, full_error=True)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "export_dtype" in done.stderr
    assert COMMANDS["export"][1] in done.stderr


def test_run_command_passes_the_exit_status_through_and_reports_a_config_error(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert run_command(lambda argv: 2) == 2
    assert run_command(lambda argv: {"files": []}) == 0  # analysis returns its result

    def refuses(argv):
        raise ConfigError(f"--x {argv}: bad")

    assert run_command(refuses, ["1"]) == 1
    assert capsys.readouterr().err == "ConfigError: --x ['1']: bad\n"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigError, match=r"--x None: bad"):
        run_command(refuses)


def test_other_errors_are_not_swallowed():
    def breaks(argv):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_command(breaks)
