"""The OS sandbox of model-written code: bubblewrap (``bwrap``, Flatpak's sandbox), not a check in Python.

A run of the Python tool (:mod:`arlopti.tasks.env.python_tool`) is one ``bwrap`` process tree:

* **new namespaces** for users, PIDs, the network, IPC, UTS and cgroups (``--unshare-all``, and
  ``--unshare-user`` named: within ``--unshare-all`` it is only tried, and as root with user namespaces off
  bwrap would go on without one): the code
  sees only its own processes (it is PID 2, its parent is the sandbox's init), has a loopback of its own
  and no route out, and cannot signal anything outside;
* **a filesystem of its own**: read-only binds of the system's libraries and tools (``/usr`` and the
  ``/lib``, ``/lib64``, ``/bin`` links into it), of the interpreter's installation
  (``sys.base_prefix``) and of the venv (``sys.prefix``, so sympy and numpy import); one writable
  directory (the run's working directory, at the same path as on the host: a fresh tmpfs of at most
  ``disk_bytes``, the run's files bound into it read-only); a private ``/tmp`` bounded the same way, a
  fresh ``/proc`` of the new PID namespace and a minimal ``/dev``. Nothing else of the host exists
  there: not ``/etc``, not the home directories, not the repository, not the host's ``/tmp``;
* **a clean environment** (``--clearenv`` plus the few variables :func:`sandbox_env` names; ``bwrap``
  itself is started with that environment too, so the sandbox's init holds none of the trainer's);
* ``--die-with-parent`` (a killed trainer or a killed ``bwrap`` takes the whole tree with it) and
  ``--new-session`` (no access to the trainer's terminal);
* **a process cap**: ``RLIMIT_NPROC``, set inside, counts the processes of the sandbox's own user
  namespace, but it does not bind root (the kernel exempts the host's root user). Started by root, the
  run is therefore placed in a ``pids`` cgroup of its own whose ``pids.max`` is the cap, and, where a
  ``memory`` hierarchy is writable, a ``memory`` cgroup whose limit bounds the whole tree's resident
  memory (:class:`RunCgroups`; without it the bound is the process cap times ``RLIMIT_AS``). The other
  limits (CPU time, address space, file size, open files) are set inside by the child before it runs
  the code; the wall clock stays outside, killing the whole tree.

:func:`require_sandbox` checks, once per process, that all of this works here (``bwrap`` installed,
user namespaces allowed and the sandbox's user namespace really its own, a process cap available) and
otherwise raises :class:`SandboxUnavailable`, one line naming the fix. The same check first sweeps the
run cgroups whose process is gone (:func:`sweep_stale_cgroups`: a trainer killed during a call leaves its
own behind); a run removes its cgroups on every exit path. docs/multi_turn_envs.md states the threat model
and what each run costs.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arlopti.config import ConfigError

#: What installs the sandbox (README, Makefile, CI do this).
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                "`make install` does it as root)")
_SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


class SandboxUnavailable(ConfigError):
    """The OS sandbox cannot run on this machine; the message says why and how to fix it."""


def sandbox_env(workdir: str) -> dict[str, str]:
    """The whole environment of sandboxed code (and of ``bwrap``): nothing of the trainer's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg"}


def _read_only_binds() -> list[str]:
    """``--ro-bind`` / ``--symlink`` arguments for the system paths, the interpreter and the venv."""
    args: list[str] = []
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    roots = sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), os.path.abspath(sys.prefix)})
    for root in roots:
        covered = [r for r in ("/usr", *roots) if r != root and root.startswith(r.rstrip("/") + "/")]
        if not covered:  # a venv inside the interpreter's folder is bound with it
            args += ["--ro-bind", root, root]
    return args


#: The bound on each of the sandbox's writable folders (its working directory and its private ``/tmp``) where
#: the caller names none: bytes, a size-limited tmpfs each (``PythonLimits.max_disk_mb`` sets it per run).
DEFAULT_DISK_BYTES = 64 * 2**20


def bwrap_args(workdir: str, disk_bytes: int = DEFAULT_DISK_BYTES, files: tuple[str, ...] = ()) -> list[str]:
    """The ``bwrap`` command line (up to the sandboxed command) for one run in ``workdir`` (module
    docstring). The working directory is a fresh tmpfs of at most ``disk_bytes`` at ``workdir``'s path, as is
    the private ``/tmp``; ``files`` (names in the host's ``workdir``, e.g. ``main.py``) are bound into it
    read-only."""
    bwrap = shutil.which("bwrap") or "bwrap"
    env = [a for k, v in sandbox_env(workdir).items() for a in ("--setenv", k, v)]
    size = ["--size", str(int(disk_bytes))]
    binds = [a for name in files for a in ("--ro-bind", os.path.join(workdir, name), os.path.join(workdir, name))]
    # bwrap mounts in order: the private /tmp first, so that a venv (or a checkout) under the host's /tmp is
    # bound over it rather than hidden by it. --unshare-user is named although --unshare-all includes it: there
    # it is only tried (as root with user namespaces off, bwrap goes on without one), here it is required
    return [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--proc", "/proc",
            "--dev", "/dev", *size, "--tmpfs", "/tmp", *_read_only_binds(), *size, "--tmpfs", workdir, *binds,
            "--chdir", workdir, "--clearenv", *env, "--"]


def _hierarchy(controller: str) -> Path | None:
    """This process's cgroup directory in a writable hierarchy of ``controller`` (cgroup v1's own mount, or
    v2), or None. Whether a child cgroup there really gets the controller's files is for
    :class:`RunCgroups` to find out."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = [m.split(" - ") for m in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        v2 = controllers == ""
        if not v2 and controller not in controllers.split(","):
            continue
        for left, right in (m for m in mounts if len(m) == 2):
            fstype, options = right.split()[0], right.split()[-1].split(",")
            if not ((v2 and fstype == "cgroup2") or (not v2 and fstype == "cgroup" and controller in options)):
                continue
            mount_root, mount_point = left.split()[3:5]
            if rel == mount_root or rel.startswith(mount_root.rstrip("/") + "/"):
                base = Path(mount_point) / rel[len(mount_root):].lstrip("/")
                if os.access(base, os.W_OK):
                    return base
    return None


#: The name of each run's cgroup folders: ``arlopti-sandbox-<pid of the process that made it>-<n>``.
CGROUP_PREFIX = "arlopti-sandbox-"
#: Per controller: the limit files of a child cgroup (v1's name, v2's name), and where an OOM kill is counted.
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max")}


class RunCgroups:
    """The limits of one run's whole process tree (module docstring). ``processes``: processes and threads,
    ``RLIMIT_NPROC`` inside the sandbox for a non-root trainer (:attr:`rlimit_nproc`, set by the child), a
    ``pids`` cgroup of the run's own for root (required: :class:`SandboxUnavailable` without one).
    ``memory_bytes``: the resident memory of the whole tree, a ``memory`` cgroup of the run's own where
    one can be made (root); elsewhere the bound is ``processes`` times each process's ``RLIMIT_AS``.
    :attr:`prefix` is the command that enters the cgroups before ``exec bwrap``. Use as a context
    manager around the run: the cgroups go when the run's processes are gone. ``processes=0``: none of
    it (a run outside the sandbox, where ``RLIMIT_NPROC`` would count every process of the user)."""

    def __init__(self, processes: int, memory_bytes: int = 0):
        self.limits = {"pids": int(processes), "memory": int(memory_bytes)}
        self.cgroups: dict[str, Path] = {}
        self.rlimit_nproc = self.limits["pids"] if os.geteuid() != 0 else 0

    def __enter__(self) -> "RunCgroups":
        if self.rlimit_nproc or not self.limits["pids"]:
            return self
        try:  # whatever fails half-way (a refused write, an interrupt), the folders made so far go
            self._make_all(f"{CGROUP_PREFIX}{os.getpid()}-{time.monotonic_ns()}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _make_all(self, name: str) -> None:
        for controller, limit in self.limits.items():
            parent = _hierarchy(controller) if limit else None
            made = parent is not None and self._make(controller, parent / name, limit)
            if controller == "pids" and not made:
                raise SandboxUnavailable(_NO_CAP)

    def _make(self, controller: str, path: Path, limit: int) -> bool:
        try:
            path.mkdir()
        except OSError:
            return False
        self.cgroups[controller] = path
        for name in dict.fromkeys(_LIMIT_FILES[controller]):
            if (path / name).exists():  # absent where v2 does not enable the controller below
                (path / name).write_text(str(limit))
                return True
        return False

    @property
    def prefix(self) -> list[str]:
        if not self.cgroups:
            return []
        enter = " && ".join(f"echo $$ > {shlex.quote(str(p / 'cgroup.procs'))}" for p in self.cgroups.values())
        return ["/bin/sh", "-c", f'{enter} && exec "$@"', "sh"]

    def oom_killed(self) -> bool:
        """Whether the memory cgroup killed a process of the run (v1 ``memory.oom_control``, v2 ``memory.events``)."""
        path = self.cgroups.get("memory")
        for name in ("memory.oom_control", "memory.events"):
            try:
                counts = dict(line.split()[:2] for line in (path / name).read_text().splitlines() if line.strip())
            except (OSError, TypeError, ValueError):
                continue
            return int(counts.get("oom_kill", 0)) > 0
        return False

    def __exit__(self, *exc) -> None:
        cgroups, self.cgroups = self.cgroups, {}
        for path in cgroups.values():
            _remove_cgroup(path)


def _remove_cgroup(path: Path, seconds: float = 5.0) -> bool:
    """Remove a run's cgroup folder, SIGKILLing what is left in it (the namespace's processes die as their init
    does, asynchronously); whether it is gone within ``seconds``."""
    deadline = time.monotonic() + seconds
    while path.exists():
        try:
            path.rmdir()
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:  # pragma: no cover - a process SIGKILL cannot end
                return False
            _kill_all(path)
            time.sleep(0.005)
    return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep_stale_cgroups() -> list[Path]:
    """Remove the run cgroups (``arlopti-sandbox-<pid>-<n>``, in this process's cgroup of each controller) whose
    process is gone: a trainer (or an episode's process) killed during a call cannot remove its own. Run at
    start-up (:func:`sandbox_problem`); returns what it removed. A folder of a live process is left alone."""
    removed = []
    for controller in _LIMIT_FILES:
        parent = _hierarchy(controller)
        for path in parent.glob(f"{CGROUP_PREFIX}*") if parent is not None else ():
            owner = path.name[len(CGROUP_PREFIX):].split("-")[0]
            if owner.isdigit() and not _alive(int(owner)) and _remove_cgroup(path):
                removed.append(path)
    return removed


def _kill_all(cgroup: Path) -> None:
    """SIGKILL every process left in ``cgroup`` (v1 has no ``cgroup.kill``)."""
    try:
        pids = (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


_NO_CAP = ("the Python tool's sandbox has no process cap here: the trainer runs as root (RLIMIT_NPROC does not bind "
           "root) and no writable pids cgroup was found; run the trainer as a non-root user, or give it a pids cgroup "
           "(cgroup v1 pids or v2 with +pids), or opt out with the environment's class attribute sandbox = False "
           "(docs/multi_turn_envs.md)")


@functools.cache
def sandbox_problem() -> str | None:
    """Why the sandbox cannot run here (one line naming the fix), or None: ``bwrap`` is found, starts a
    sandbox with new namespaces (a user namespace of its own among them), and a process cap is available.
    Checked once per process; the stale cgroups of killed runs are swept first (:func:`sweep_stale_cgroups`)."""
    if shutil.which("bwrap") is None:
        return f"the Python tool's sandbox needs bubblewrap (bwrap) and it is not on PATH: {INSTALL_HINT}"
    sweep_stale_cgroups()
    try:
        with tempfile.TemporaryDirectory(prefix="arlopti-probe-") as tmp:
            workdir = os.path.realpath(tmp)
            probe = subprocess.run([*bwrap_args(workdir), "readlink", "/proc/self/ns/user"],
                                   env=sandbox_env(workdir), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the Python tool's sandbox (bwrap) could not start: {err}; {INSTALL_HINT}"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return (f"the Python tool's sandbox (bwrap) could not start ({why}): unprivileged user namespaces are "
                "probably disabled; enable them (sysctl kernel.unprivileged_userns_clone=1, or "
                "user.max_user_namespaces > 0) or run in a container that allows them")
    problem = _user_namespace_problem(probe.stdout.strip())
    if problem is None:
        try:
            with RunCgroups(4):
                pass
        except SandboxUnavailable as err:
            problem = str(err)
    return problem


def _user_namespace_problem(inside: str) -> str | None:
    """Why the sandbox's user namespace (``inside``: ``readlink /proc/self/ns/user`` run in it) is not one of its
    own, or None. As root with user namespaces off, ``bwrap --unshare-all`` goes on without one (it only tries),
    and the code would run as the host's root: refused rather than run so."""
    try:
        host = os.readlink("/proc/self/ns/user")
    except OSError:  # a kernel without user namespaces: bwrap's --unshare-user has failed already
        return None
    if inside and inside != host:
        return None
    return (f"the Python tool's sandbox (bwrap) ran without a user namespace of its own (inside: "
            f"{inside or 'nothing read'}, the trainer's: {host}): user namespaces are probably disabled, and as root "
            "bwrap goes on without one; enable them (sysctl user.max_user_namespaces=15000, or "
            "kernel.unprivileged_userns_clone=1), or opt out with the environment's class attribute sandbox = False "
            "(docs/multi_turn_envs.md)")


def require_sandbox() -> None:
    """Raise :class:`SandboxUnavailable` (one line naming the fix) unless the sandbox works here."""
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(problem)


__all__ = ["CGROUP_PREFIX", "DEFAULT_DISK_BYTES", "INSTALL_HINT", "RunCgroups", "SandboxUnavailable", "bwrap_args",
           "require_sandbox", "sandbox_env", "sandbox_problem", "sweep_stale_cgroups"]
