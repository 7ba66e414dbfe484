"""An environment's episodes in killable worker processes: the trainer's side.

:class:`EnvWorkers` starts the host of :mod:`arlopti.tasks.env.worker_host` (lazily, at the first
:meth:`EnvWorkers.open`; again after the host died), asks it for one process per episode, and runs
batches of calls (:meth:`EnvWorkers.stream`): every episode's calls in order, the episodes' calls all at
once, each bounded by its timeout. A call past its timeout, or whose process ended (an ``os._exit``, a
crash, a kill), fails, and that episode's process is gone (killed at the deadline): the episode's
instance cannot be called again. So a hung ``step`` costs one timeout per batch, not one per episode, and
an environment that exits takes down its own episode's process, never the trainer.

A reader thread moves the host's messages into a queue (the host may be sending results while the
trainer is still sending calls, and neither may block the other). The host goes when the object is
collected or closed (:meth:`EnvWorkers.close`), and by itself when the trainer's end of its pipe closes
(the trainer exited or was killed).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection

from arlopti.tasks.env.calls import CallResult, plain_loads
from arlopti.tasks.env.worker_host import BOOT, MAX_MESSAGE_BYTES, READ_DEADLINE_S

log = logging.getLogger(__name__)


class EnvWorkerLoadError(RuntimeError):
    """The host could not import the environment (the message is the host's)."""


def ended(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if code is None:
        return "ended (its exit status is unknown)"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _stop_host(proc: subprocess.Popen, inbox: Connection) -> None:
    """Ask the host to exit (it kills its episodes), then kill it if it does not within 2 s."""
    try:
        inbox.send(None)
    except (OSError, ValueError):
        pass
    try:
        inbox.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class EnvWorkers:
    """The episodes of the environment ``spec`` (a ``module:Class`` or an absolute ``/path/file.py:Class``;
    ``name``: as messages name it; ``text``: the text contract) in worker processes (module docstring).
    One thread at a time."""

    def __init__(self, spec: str, name: str, text: bool, sys_path: list[str] | None = None,
                 boot_timeout_s: float = 120.0, read_deadline_s: float = READ_DEADLINE_S,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.spec, self.name, self.text = spec, name, text
        self.sys_path = list(sys_path if sys_path is not None else default_sys_path())
        self.boot_timeout_s = boot_timeout_s
        # the host's bounds on each message of an episode (arlopti.tasks.env.worker_host: no episode wedges it)
        self.read_deadline_s, self.max_message_bytes = float(read_deadline_s), int(max_message_bytes)
        self._proc: subprocess.Popen | None = None
        self._inbox: Connection | None = None
        self._queue: queue.Queue = queue.Queue()
        self._cids = itertools.count()
        self._finalizer = None
        self.stats = {"hosts": 0, "episodes": 0, "timeouts": 0, "died": 0}

    # ---------------------------------------------------------------- the host
    def start(self) -> None:
        """Start the host and wait for it to import the environment (``boot_timeout_s``); a host that cannot
        raises :class:`EnvWorkerLoadError` with its message."""
        if self._proc is not None:
            return
        to_host_r, to_host_w = os.pipe()
        from_host_r, from_host_w = os.pipe()
        cfg = {"spec": self.spec, "text": self.text, "cwd": os.getcwd(), "sys_path": self.sys_path,
               "read_deadline_s": self.read_deadline_s, "max_message_bytes": self.max_message_bytes}
        try:
            proc = subprocess.Popen([sys.executable, "-c", BOOT, str(to_host_r), str(from_host_w), json.dumps(cfg)],
                                    pass_fds=(to_host_r, from_host_w), stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(to_host_r)
            os.close(from_host_w)
        inbox, outbox = Connection(to_host_w, readable=False), Connection(from_host_r, writable=False)
        msg = self._boot_message(outbox)
        if msg[0] != "ready":
            _stop_host(proc, inbox)
            outbox.close()
            raise EnvWorkerLoadError(str(msg[1]))
        self._proc, self._inbox, self._queue = proc, inbox, queue.Queue()
        threading.Thread(target=self._read, args=(outbox, self._queue), name="arlopti-env-host", daemon=True).start()
        self._finalizer = weakref.finalize(self, _stop_host, proc, inbox)
        self.stats["hosts"] += 1

    def _boot_message(self, outbox: Connection) -> tuple:
        """The host's first message (``("ready", pid)`` or ``("load_error", line)``), read as plain values."""
        if not outbox.poll(self.boot_timeout_s):
            return ("load_error", f"not ready after {self.boot_timeout_s:.0f} s")
        try:
            return plain_loads(outbox.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError) as err:
            return ("load_error", f"the host ended before it was ready ({type(err).__name__}: {err})")

    @staticmethod
    def _read(outbox: Connection, into: queue.Queue) -> None:
        """The reader thread: the host's messages into ``into``, then ``("host_died",)`` at its end."""
        while True:
            try:
                msg = plain_loads(outbox.recv_bytes())  # the host runs user code: plain values only
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            into.put(msg)
        outbox.close()
        into.put(("host_died",))

    def _send(self, msg) -> bool:
        if self._inbox is None:
            return False
        try:
            self._inbox.send(msg)
            return True
        except (OSError, ValueError):
            return False

    def _lost(self) -> str:
        """The host is gone: forget it (the next :meth:`open` starts another) and say how it ended."""
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._inbox is not None:
            try:
                self._inbox.close()
            except OSError:
                pass
            self._inbox = None
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        return f"the environment's worker host (pid {getattr(proc, 'pid', '?')}) {ended(code)}"

    def close(self) -> None:
        """Stop the host and every episode process it holds."""
        if self._finalizer is not None:
            self._finalizer()
        self._proc, self._inbox = None, None

    # ---------------------------------------------------------------- episodes
    def open(self, keys: list[int]) -> None:
        """One process per episode key (a key is never reused)."""
        self.start()
        if not self._send(("open", list(keys))):
            log.warning("%s; starting another", self._lost())
            self.start()
            self._send(("open", list(keys)))
        self.stats["episodes"] += len(keys)

    def end(self, keys: list[int], timeout_s: float) -> None:
        """The episodes' ``close`` (each process then exits; killed after ``timeout_s``). Not waited for."""
        if self._proc is not None and keys:
            self._send(("end", list(keys), float(timeout_s)))

    def kill(self, keys: list[int]) -> None:
        if self._proc is not None and keys:
            self._send(("kill", list(keys)))

    def stream(self, jobs: list[list], timeout_s: float) -> Iterator[tuple[int, int, CallResult]]:
        """``(job, index, result)`` of each call as it finishes (module docstring). ``jobs``: per episode its
        calls (:class:`arlopti.rollout.env_calls.EnvCall`), run in order; after a call whose process is gone
        (``result.gone``) that episode's later calls are not run. Closing the generator early kills the
        calls still running."""
        flight: dict[int, list] = {}  # key -> [job, index, cid, start, deadline]
        for j, job in enumerate(jobs):
            if job:
                self._submit(jobs, j, 0, flight, timeout_s)
        try:
            while flight:
                for key, r in self._next(flight):
                    j, k = flight.pop(key)[:2]
                    yield j, k, r
                    if not r.gone and k + 1 < len(jobs[j]):
                        self._submit(jobs, j, k + 1, flight, timeout_s)
        finally:
            if flight:
                self.kill(list(flight))

    def _submit(self, jobs, j: int, k: int, flight: dict, timeout_s: float) -> None:
        c = jobs[j][k]
        cid = next(self._cids)
        now = time.monotonic()
        flight[c.key] = [j, k, cid, now, now + timeout_s, c]
        if not self._send(("call", c.key, cid, pickle.dumps((cid, c.method, c.args, c.seed)))):
            self._queue.put(("died", c.key, cid, None))

    def _next(self, flight: dict) -> list[tuple[int, CallResult]]:
        """The calls that finished next: a message from the host, or those past their deadline."""
        wait_s = max(0.0, min(f[4] for f in flight.values()) - time.monotonic())
        try:
            msg = self._queue.get(timeout=wait_s)
        except queue.Empty:
            msg = None
        now = time.monotonic()
        if msg is not None and msg[0] == "host_died":
            why = self._lost()
            return [(key, CallResult(error=f"EnvWorkerDied: {self.name}.{f[5].what}: {why} during the call",
                                     gone=True, seconds=now - f[3])) for key, f in flight.items()]
        done = []
        if msg is not None and msg[1] in flight and flight[msg[1]][2] == msg[2]:
            done.append((msg[1], self._result(msg, flight[msg[1]], now)))
        late = [key for key, f in flight.items() if f[4] <= now and all(key != d[0] for d in done)]
        for key in late:
            self.stats["timeouts"] += 1
            done.append((key, CallResult(timeout=True, gone=True, seconds=now - flight[key][3])))
        self.kill(late)  # its process is killed at the deadline: the episode's instance is gone
        return done

    def _result(self, msg: tuple, f: list, now: float) -> CallResult:
        seconds, what = now - f[3], f[5].what
        if msg[0] in ("died", "broken"):
            self.stats["died"] += 1
            how = f"{ended(msg[3])} during the call" if msg[0] == "died" else f"{msg[3]}; it was killed"
            return CallResult(error=f"EnvWorkerDied: {self.name}.{what}: the episode's environment process {how}",
                              gone=True, seconds=seconds)
        try:
            status, payload = plain_loads(msg[3])
        except Exception as err:  # noqa: BLE001 - a value the trainer cannot unpickle
            return CallResult(error=f"TypeError: {what} returned a value the trainer cannot read "
                                    f"({type(err).__name__}: {err})", seconds=seconds)
        if status == "ok":
            return CallResult(value=payload, seconds=seconds)
        return CallResult(error=payload[0], detail=payload[1], seconds=seconds, build_failed=status == "build_error")


def default_sys_path() -> list[str]:
    """The host's ``sys.path`` head: the current directory, then this process's entries, so a class
    imported here by name (a module a notebook or pytest put on ``sys.path``) imports there too."""
    return [os.getcwd()] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]


__all__ = ["EnvWorkerLoadError", "EnvWorkers", "default_sys_path", "ended"]
