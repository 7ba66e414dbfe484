"""Issue 52 row 5: the sandbox says what happened and cleans up. bwrap's ``128 + n`` exit codes read as the signal
(the CPU limit is a timeout with its reason line, as without the sandbox; another signal is named); a run's cgroups
go on every exit path and stale ones of a killed trainer are swept at start-up; the working directory's size is
bounded; and a bwrap that runs without a user namespace of its own is refused at start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from arlopti.tasks.env import sandbox
from arlopti.tasks.env.python_tool import PythonLimits, run_python

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

ROOT_CGROUPS = os.geteuid() == 0 and sandbox._hierarchy("pids") is not None
needs_root_cgroups = pytest.mark.skipif(not ROOT_CGROUPS, reason="the run's cgroups exist only for a root trainer "
                                                                 "with a writable pids hierarchy")


@pytest.fixture
def fresh_check():
    """The start-up check is cached per process: start from an empty cache and leave one behind."""
    sandbox.sandbox_problem.cache_clear()
    yield
    sandbox.sandbox_problem.cache_clear()


def ours() -> set[Path]:
    """This process's run cgroups (named after its pid) in every hierarchy the sandbox uses."""
    found = set()
    for controller in ("pids", "memory"):
        parent = sandbox._hierarchy(controller)
        if parent is not None:
            found |= set(parent.glob(f"arlopti-sandbox-{os.getpid()}-*"))
    return found


# ----------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize("spin", ["while True:\n    pass",
                                  "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                                  "while True:\n    pass"],
                         ids=["sigxcpu", "sigkill_at_the_hard_limit"])
def test_the_cpu_limit_in_the_sandbox_is_a_timeout_with_its_reason(spin):
    r = run_python(f"print('started')\n{spin}", PythonLimits(cpu_s=1, wall_s=30))
    assert r.status == "timeout", (r.status, r.exit_code, r.output)
    assert r.reply() == "started\nTimeoutError: the code was stopped after 1 s of CPU time (its limit)"


def test_the_cpu_limit_without_the_sandbox_says_the_same():
    r = run_python("while True:\n    pass", PythonLimits(cpu_s=1, wall_s=30), sandbox=False)
    assert r.status == "timeout" and r.reply() == "TimeoutError: the code was stopped after 1 s of CPU time (its limit)"


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "bare"])
@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGKILL", "SIGTERM"])
def test_another_signal_is_named(sig, sandboxed):
    r = run_python(f"import os, signal\nprint('before')\nos.kill(os.getpid(), signal.{sig})",
                   PythonLimits(cpu_s=5, wall_s=30), sandbox=sandboxed)
    number = int(getattr(signal, sig))
    assert r.status == "error" and r.exit_code == -number, (r.status, r.exit_code, r.output)
    assert r.reply() == f"before\nthe code was killed by signal {number} ({sig})"


def test_a_wall_clock_timeout_still_says_wall_clock():
    r = run_python("import time\ntime.sleep(60)", PythonLimits(cpu_s=5, wall_s=1))
    assert r.status == "timeout" and r.reply() == "TimeoutError: the code was stopped after 1 s (wall clock)"


# ----------------------------------------------------------------------------- cgroups


@needs_root_cgroups
def test_a_failure_while_making_the_cgroups_leaves_none(monkeypatch):
    made = []
    real = sandbox.RunCgroups._make

    def fail_on_memory(self, controller, path, limit):
        if controller == "memory":
            raise OSError(28, "No space left on device")
        made.append(path)
        return real(self, controller, path, limit)

    monkeypatch.setattr(sandbox.RunCgroups, "_make", fail_on_memory)
    with pytest.raises(OSError):
        with sandbox.RunCgroups(8, 300 * 2**20):
            pass
    assert made and not any(p.exists() for p in made) and not ours()


@needs_root_cgroups
def test_the_cgroups_of_a_trainer_killed_mid_call_are_swept_at_start_up(fresh_check, tmp_path):
    script = ("from arlopti.tasks.env.python_tool import PythonLimits, run_python\n"
              "run_python('import time\\ntime.sleep(120)', PythonLimits(wall_s=120))")
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    parents = [p for p in (sandbox._hierarchy(c) for c in ("pids", "memory")) if p is not None]
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and not any(p.glob(f"arlopti-sandbox-{trainer.pid}-*") for p in parents):
            time.sleep(0.05)
        time.sleep(1.0)  # the call is under way
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    stale = [c for p in parents for c in p.glob(f"arlopti-sandbox-{trainer.pid}-*")]
    assert stale  # a killed trainer cannot clean up: its run's cgroups stay behind
    live = parents[0] / f"arlopti-sandbox-{os.getpid()}-0"  # a folder of a live process is not touched
    live.mkdir()
    try:
        assert sandbox.sandbox_problem() is None
        assert not any(c.exists() for c in stale) and live.exists()
    finally:
        live.rmdir()


# ----------------------------------------------------------------------------- the working directory's size


def test_the_working_directory_and_tmp_are_bounded():
    code = textwrap.dedent("""
        import os
        for where in (".", "/tmp"):
            written = 0
            try:
                for i in range(40):
                    with open(os.path.join(where, f"f{i}"), "wb") as f:
                        f.write(b"x" * (4 * 2**20))
                    written += 4
            except OSError as err:
                print(where, "stopped", written, err.errno)
            else:
                print(where, "wrote", written)
    """)
    r = run_python(code, PythonLimits(max_file_mb=8, max_disk_mb=32, wall_s=30, max_output_bytes=4096))
    lines = r.output.splitlines()
    assert r.ok and len(lines) == 2, r.output
    for line, where in zip(lines, (".", "/tmp")):
        name, what, mb, errno_ = line.split()
        assert (name, what, errno_) == (where, "stopped", "28") and int(mb) <= 32, r.output  # ENOSPC


def test_max_disk_mb_is_checked():
    with pytest.raises(ValueError, match=r"PythonLimits.max_disk_mb=0: expected a number > 0"):
        PythonLimits(max_disk_mb=0)


# ----------------------------------------------------------------------------- the user namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run bwrap without a user namespace")
def test_a_sandbox_without_a_user_namespace_of_its_own_is_refused(fresh_check, monkeypatch, tmp_path):
    """As root with user namespaces off, bwrap --unshare-all goes on without one. A shim that drops the user
    namespace (and keeps the others) plays that bwrap: the start-up check must see it and refuse."""
    real = subprocess.run(["sh", "-c", "command -v bwrap"], capture_output=True, text=True).stdout.strip()
    shim = tmp_path / "bwrap"
    shim.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        args=()
        for a in "$@"; do
          case "$a" in
            --unshare-all) args+=(--unshare-pid --unshare-net --unshare-ipc --unshare-uts) ;;
            --unshare-user|--unshare-user-try) ;;
            *) args+=("$a") ;;
          esac
        done
        exec {real} "${{args[@]}}"
    """))
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.require_sandbox()
    line = str(err.value)
    assert "\n" not in line and "ran without a user namespace of its own" in line and "user.max_user_namespaces" in line
