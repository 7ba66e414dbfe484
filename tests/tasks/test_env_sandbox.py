"""The sandbox's start-up checks: where bubblewrap is missing, user namespaces are off or no process cap can
be set, the Python tool refuses in one line naming the fix; the opt-out runs with a warning."""

from __future__ import annotations

import logging
import os

import pytest

from arlopti.tasks.env import sandbox
from arlopti.tasks.env.math_tool import MathPythonTool, MathToolEnv
from arlopti.tasks.env.python_tool import run_python


@pytest.fixture
def fresh_check():
    """The check is cached per process: start from an empty cache and leave one behind."""
    sandbox.sandbox_problem.cache_clear()
    yield
    sandbox.sandbox_problem.cache_clear()


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text
    return text


def test_missing_bwrap_is_refused_naming_the_install(fresh_check, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        MathToolEnv()
    assert "bubblewrap" in _one_line(err.value) and "apt-get install bubblewrap" in str(err.value)
    with pytest.raises(sandbox.SandboxUnavailable):
        run_python("print(1)")


def test_user_namespaces_off_is_refused_naming_the_sysctl(fresh_check, monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"  # what bwrap prints where the kernel refuses a new user namespace
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        MathPythonTool()
    text = _one_line(err.value)
    assert "No permissions to create new namespace" in text and "unprivileged_userns_clone" in text


def test_root_without_a_pids_cgroup_is_refused(fresh_check, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "_pids_hierarchy", lambda: None)
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        MathToolEnv()
    assert "RLIMIT_NPROC does not bind root" in _one_line(err.value) and "sandbox = False" in str(err.value)


def test_the_check_is_a_config_error_for_the_commands_one_line_report():
    from arlopti.config import ConfigError

    assert issubclass(sandbox.SandboxUnavailable, ConfigError)


def test_the_opt_out_warns_once_and_runs_outside(fresh_check, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap: the opt-out does not need it

    class Unsandboxed(MathPythonTool):
        sandbox = False

    with caplog.at_level(logging.WARNING):
        first, second = Unsandboxed(), Unsandboxed()
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT the OS sandbox" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("Unsandboxed.sandbox = False")
    assert first.python("import os\nos.path.isdir('/etc')") == "True\n" and second.runs == []


def test_a_process_cap_of_its_own_per_run_and_none_left():
    cap = sandbox.ProcessCap(8)
    with cap:
        if os.geteuid() == 0:
            assert cap.cgroup is not None and (cap.cgroup / "pids.max").read_text().strip() == "8"
            assert cap.prefix[-1].endswith("cgroup.procs")
        else:
            assert cap.rlimit == 8 and cap.prefix == []
    assert cap.cgroup is None or not cap.cgroup.exists()
