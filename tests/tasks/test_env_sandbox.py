"""The sandbox's start-up checks: where bubblewrap is missing, user namespaces are off or no process cap can
be set, the Python tool refuses in one line naming the fix; the opt-out runs with a warning."""

from __future__ import annotations

import logging
import os

import pytest

from arlopti.tasks.env import sandbox
from arlopti.tasks.env.math_tool import MathPythonTool, MathToolEnv
from arlopti.tasks.env.python_tool import PythonLimits, run_python


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


@pytest.mark.process


def test_user_namespaces_off_is_refused_naming_the_sysctl(fresh_check, monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"  # what bwrap prints where the kernel refuses a new user namespace
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        MathPythonTool()
    text = _one_line(err.value)
    assert "No permissions to create new namespace" in text and "unprivileged_userns_clone" in text


@pytest.mark.process


def test_root_without_a_pids_cgroup_is_refused(fresh_check, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "_hierarchy", lambda controller: None)
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        MathToolEnv()
    assert "RLIMIT_NPROC does not bind root" in _one_line(err.value) and "sandbox = False" in str(err.value)


def test_the_check_is_a_config_error_for_the_commands_one_line_report():
    from arlopti.config import ConfigError

    assert issubclass(sandbox.SandboxUnavailable, ConfigError)


@pytest.mark.process


def test_the_opt_out_warns_once_and_runs_outside(fresh_check, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap: the opt-out does not need it

    class Unsandboxed(MathPythonTool):
        sandbox = False

    with caplog.at_level(logging.WARNING):
        first, second = Unsandboxed(), Unsandboxed()
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT the OS sandbox" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("Unsandboxed.sandbox = False")
    assert first.python("import os\nos.path.isdir('/etc')") == "True\n" and second.runs == []


def test_cgroups_of_its_own_per_run_and_none_left():
    cgroups = sandbox.RunCgroups(8, 300 * 2**20)
    with cgroups:
        if os.geteuid() == 0:
            assert (cgroups.cgroups["pids"] / "pids.max").read_text().strip() == "8"
            assert cgroups.prefix[:2] == ["/bin/sh", "-c"] and "cgroup.procs" in cgroups.prefix[2]
        else:
            assert cgroups.rlimit_nproc == 8 and cgroups.prefix == []
    assert cgroups.cgroups == {} and not any(p.exists() for p in list(cgroups.cgroups.values()))


@pytest.mark.skipif(os.geteuid() != 0 or sandbox._hierarchy("memory") is None,
                    reason="no writable memory cgroup here: the tree's memory is bounded by processes x RLIMIT_AS")
@pytest.mark.process
def test_forked_hogs_are_bounded_as_a_tree():
    """Six processes of 200 MB each stay under one process's 256 MB address space, and would hold 1.2 GB;
    the run's memory cgroup (256 + 256 MB) ends it as a memory error."""
    code = ("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        break\n"
            "x = bytearray(200 * 2**20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\ntime.sleep(3)\nprint('held')")
    r = run_python(code, PythonLimits(cpu_s=5, wall_s=8, memory_mb=256))
    assert r.status == "memory", (r.status, r.output[-500:])
