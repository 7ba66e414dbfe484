"""Run model-written Python in a throwaway directory, inside the OS sandbox, with limits.

The runner of the built-in "math with a Python tool" environments (:mod:`arlopti.tasks.env.math_tool`,
ToRL / ReTool style): :func:`run_python` writes the code to ``main.py`` in a fresh temporary
directory and runs it in a new interpreter inside a bubblewrap sandbox of its own
(:mod:`arlopti.tasks.env.sandbox`: new user, PID, network and IPC namespaces, read-only system,
interpreter and venv, the directory the only writable place, a clean environment), and returns a
:class:`RunResult` whose :meth:`RunResult.reply` is what the model is shown.

* **limits** (:class:`PythonLimits`), set by the child inside the sandbox before the code runs: CPU
  seconds (``RLIMIT_CPU``), an address-space cap (``RLIMIT_AS``), the largest file it may write
  (``RLIMIT_FSIZE``), open files (``RLIMIT_NOFILE``), no core files, and the number of processes and
  threads (:class:`~arlopti.tasks.env.sandbox.RunCgroups`; where it can make a memory cgroup, the
  whole tree's resident memory is bounded too, by ``memory_mb`` + 256 MB); in the sandbox, the working
  directory's and the private ``/tmp``'s total size (``max_disk_mb``, a size-limited tmpfs each); outside,
  a wall-clock deadline (the whole sandbox is SIGKILLed, and the child's own ``alarm`` ends it should the
  trainer die first) and an output cap (the trainer stops reading and kills it once more than
  ``max_output_bytes`` arrived, so a 100 MB print costs a few KB);
* the interpreter is ``sys.executable`` run as ``python -I -B`` (no ``PYTHON*`` variables, no user
  site, no bytecode written), so the packages of this environment (sympy, numpy) import; stdin is
  ``/dev/null``; the working directory is deleted afterwards, and every process the run started is
  gone when it ends (the PID namespace dies with its first process).

How it ended is read the same with and without the sandbox (``bwrap`` reports a child killed by signal
``n`` as ``128 + n``, read back as the signal): the CPU limit's ``SIGXCPU``, or a ``SIGKILL`` once the
tree used that much CPU (``RLIMIT_CPU``'s hard limit), is a ``timeout`` whose reply says "CPU time"; any
other signal is an ``error`` whose reply's last line names it.

The code may do anything inside: fork, open sockets (there is only its own loopback), load C code. What
the sandbox refuses is the kernel's doing, not a check in Python. ``sandbox=False`` (the environments'
class attribute ``sandbox``) runs the same child without the sandbox: the limits hold, nothing else
does; it is for code you trust, and the environments warn at start-up when it is off.

Each call is independent (no state carries from one code block to the next), as in ToRL. When the
code's last statement is an expression its value is printed, as in a notebook (``echo_last=True``).
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from arlopti.tasks.env.sandbox import RunCgroups, bwrap_args, require_sandbox, sandbox_env

STATUSES = ("ok", "error", "memory", "timeout", "output_limit")
# The whole tree's resident memory, where a memory cgroup holds it: one process's address space plus this
# (each process's RLIMIT_AS stops a single hog first, with a MemoryError the model can read).
_TREE_MARGIN_MB = 256
# The child's exit code after a MemoryError (an exception exits 1). Code that itself exits 86 reads as
# "memory": only the reply's last line differs.
_EXIT_MEMORY = 86


@dataclass(frozen=True)
class PythonLimits:
    """What one run may use. Every value must be > 0."""

    cpu_s: float = 5.0  # CPU seconds (RLIMIT_CPU; the child is killed past it)
    wall_s: float = 10.0  # wall-clock seconds from start to kill (a sleeping loop uses no CPU)
    memory_mb: int = 1024  # address space (RLIMIT_AS); importing sympy and numpy fits in 192 MB (not in 128)
    max_output_bytes: int = 2048  # stdout + stderr kept; past it the run is stopped and the reply truncated
    max_file_mb: int = 16  # the largest file the code may write (RLIMIT_FSIZE)
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_processes: int = 16  # processes and threads of the whole run (sandbox.RunCgroups), its init included
    max_disk_mb: int = 64  # the working directory's total size, and the private /tmp's (a size-limited tmpfs each)

    def __post_init__(self):
        for name in ("cpu_s", "wall_s", "memory_mb", "max_output_bytes", "max_file_mb", "max_open_files",
                     "max_processes", "max_disk_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PythonLimits.{name}={value!r}: expected a number > 0")


@dataclass(frozen=True)
class RunResult:
    """One run: ``output`` (stdout and stderr interleaved, at most ``max_output_bytes``, decoded),
    ``status`` (one of :data:`STATUSES`), the exit code (negative: the signal that ended it; None:
    killed by the parent), the wall seconds, and the limits it ran under."""

    output: str
    status: str
    exit_code: int | None
    seconds: float
    limits: PythonLimits
    cause: str = ""  # a timeout's: "cpu" (the CPU limit) or "wall" (the wall clock)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"

    def reply(self) -> str:
        """What the model is shown: the output, then one line saying why the run stopped, if it
        did not end normally (the traceback of an error is already in the output)."""
        note = {
            "timeout": f"TimeoutError: the code was stopped after {self.limits.cpu_s:g} s of CPU time (its limit)"
                       if self.cause == "cpu" else
                       f"TimeoutError: the code was stopped after {self.limits.wall_s:g} s (wall clock)",
            "output_limit": f"[output truncated: more than {self.limits.max_output_bytes} bytes; the code was "
                            "stopped]",
            "memory": f"(memory limit: {self.limits.memory_mb} MB)",
            "error": _signal_note(self.exit_code),
        }.get(self.status)
        if note is None:
            return self.output
        return f"{self.output.rstrip()}\n{note}" if self.output.strip() else note


# The child: limits, then the code. Run as ``python -I -B -u -c _CHILD <limits...>`` in the working
# directory, which holds main.py (inside the sandbox, or bare with sandbox=False).
_CHILD = r'''
import ast, resource, signal, sys, traceback
cpu, mem, fsize, nofile, nproc, wall, echo = sys.argv[1:8]
limits = [(resource.RLIMIT_CPU, int(cpu), int(cpu) + 1), (resource.RLIMIT_AS, int(mem), int(mem)),
          (resource.RLIMIT_FSIZE, int(fsize), int(fsize)), (resource.RLIMIT_NOFILE, int(nofile), int(nofile)),
          (resource.RLIMIT_CORE, 0, 0)] + ([(resource.RLIMIT_NPROC, int(nproc), int(nproc))] if int(nproc) else [])
for lim, soft, hard in limits:
    resource.setrlimit(lim, (soft, hard))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises OSError instead of killing
signal.alarm(int(wall))  # ends the run even if the trainer is gone
source = open("main.py", encoding="utf-8", errors="replace").read()
scope = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(source, "main.py")
    last = tree.body.pop() if echo == "1" and tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "main.py", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "main.py", "eval"), scope)
        if value is not None:
            print(repr(value))
except SystemExit:
    raise
except BaseException as err:
    tb = None if isinstance(err, SyntaxError) else err.__traceback__.tb_next  # from the user's frame on
    traceback.print_exception(type(err), err, tb)
    sys.exit(86 if isinstance(err, MemoryError) else 1)
'''


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (``WNOWAIT``): until it is reaped its pid stays
    taken, so the process-group kill that follows cannot hit a stranger."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen) -> float:
    """SIGKILL the child's whole process group (whatever it left behind too), then reap the child; return the
    CPU seconds of its tree (``wait4``: the child and the descendants it reaped, the sandboxed code among them)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            proc.wait()
            return 0.0
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.002)
    return 0.0  # pragma: no cover - a process SIGKILL cannot end (uninterruptible IO)


def _read_bounded(proc: subprocess.Popen, limit: int, deadline: float) -> tuple[bytes, str | None]:
    """The child's output until it has exited and its output is drained (None), the deadline passes
    ("timeout") or more than ``limit`` bytes arrived ("output_limit"); at most ``limit`` bytes are
    kept. A process it left behind holding the pipe open does not keep the run going."""
    fd = proc.stdout.fileno()
    poller = select.poll()  # not select.select: a trainer's descriptors can pass FD_SETSIZE (1024)
    poller.register(fd, select.POLLIN)
    kept, size, exited = bytearray(), 0, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(kept), "timeout"
        if not poller.poll(0 if exited else min(50, max(1, int(left * 1000)))):
            if exited:
                return bytes(kept), None
            exited = _has_exited(proc.pid)  # checked once more after it: what it wrote last is read
            continue
        data = os.read(fd, 65536)
        if not data:
            return bytes(kept), None if exited or _wait_exit(proc.pid, deadline) else "timeout"
        size += len(data)
        kept += data[: max(0, limit - len(kept))]
        if size > limit:
            return bytes(kept), "output_limit"


def _wait_exit(pid: int, deadline: float) -> bool:
    """Wait (unreaped) until the child exits or ``deadline`` passes: it closed its output, and exits
    now, unless it closed its output and went on."""
    while not _has_exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


def _signal_note(code: int | None) -> str | None:
    """The reply's last line for code killed by a signal (``code`` negative), or None."""
    if code is None or code >= 0:
        return None
    try:
        return f"the code was killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"the code was killed by signal {-code}"


def _exit_code(code: int | None, sandbox: bool) -> int | None:
    """The code's exit code as without the sandbox: bwrap reports a child killed by signal ``n`` as ``128 + n``
    (so code that itself exits with 128 + n reads as killed by signal n there)."""
    if sandbox and code is not None and 128 < code < 128 + signal.NSIG:
        return 128 - code
    return code


def _status(stopped: str | None, code: int | None, cpu_s: float, limits: PythonLimits) -> tuple[str, str]:
    """``(status, cause)`` of a run that ended with ``code`` (as without the sandbox) after ``cpu_s`` CPU
    seconds of its whole tree, or was ``stopped`` by the trainer (the wall clock, the output cap)."""
    if stopped is not None:
        return stopped, "wall" if stopped == "timeout" else ""
    if code == 0:
        return "ok", ""
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (code that ignores SIGXCPU); a SIGKILL
    # before that much CPU (in the sandbox: that much wall time) was used came from elsewhere: named as a signal
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_s >= math.ceil(limits.cpu_s)):
        return "timeout", "cpu"
    if code == -signal.SIGALRM:  # the child's own alarm: the wall clock, should the trainer's deadline not hold
        return "timeout", "wall"
    return ("memory" if code == _EXIT_MEMORY else "error"), ""


def run_python(code: str, limits: PythonLimits | None = None, *, echo_last: bool = True,
               python: str | None = None, sandbox: bool = True) -> RunResult:
    """Run ``code`` under ``limits`` (module docstring), in the OS sandbox unless ``sandbox=False``, and
    return what happened. Never raises for anything the code does (a sandbox that cannot run here is
    :class:`~arlopti.tasks.env.sandbox.SandboxUnavailable`); never outlives ``limits.wall_s`` by more than
    the kill and clean-up."""
    limits = limits or PythonLimits()
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be a str, got {type(code).__name__}")
    if sandbox:
        require_sandbox()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="arlopti-py-", ignore_cleanup_errors=True) as workdir, \
            RunCgroups(limits.max_processes if sandbox else 0, (int(limits.memory_mb) + _TREE_MARGIN_MB) * 2**20) as cap:
        workdir = os.path.realpath(workdir)
        Path(workdir, "main.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        child = _child_argv(limits, echo_last, python, cap.rlimit_nproc)
        jail = [*cap.prefix, *bwrap_args(workdir, int(limits.max_disk_mb) * 2**20, ("main.py",))] if sandbox else []
        argv = [*jail, *child]
        proc = subprocess.Popen(argv, cwd=workdir, env=sandbox_env(workdir), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
        try:
            out, stopped = _read_bounded(proc, int(limits.max_output_bytes), start + limits.wall_s)
        finally:
            cpu_s = _kill_group(proc)
            proc.stdout.close()
        oom = cap.oom_killed()  # the memory cgroup's SIGKILL reads as a memory error, not a timeout
    code_ = _exit_code(proc.returncode, sandbox) if stopped is None else None
    if sandbox:  # bwrap hands its tree's CPU time back only in part (its init is not reaped): wall time bounds it
        cpu_s = max(cpu_s, time.monotonic() - start)
    status, cause = ("memory", "") if oom else _status(stopped, code_, cpu_s, limits)
    text = out.decode("utf-8", errors="replace")
    return RunResult(text, status, code_, time.monotonic() - start, limits, cause)


def _child_argv(limits: PythonLimits, echo_last: bool, python: str | None, nproc: int) -> list[str]:
    """The interpreter running :data:`_CHILD` with the limits it sets on itself (``nproc``: ``RLIMIT_NPROC``, 0
    for none)."""
    args = [str(math.ceil(limits.cpu_s)), str(int(limits.memory_mb) * 2**20), str(int(limits.max_file_mb) * 2**20),
            str(int(limits.max_open_files)), str(nproc), str(math.ceil(limits.wall_s) + 1), "1" if echo_last else "0"]
    return [python or sys.executable, "-I", "-B", "-u", "-X", "utf8", "-c", _CHILD, *args]


__all__ = ["STATUSES", "PythonLimits", "RunResult", "run_python"]
