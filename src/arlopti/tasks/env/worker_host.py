"""The process side of an environment's workers: one host per turn loop, one process per episode.

:class:`arlopti.tasks.env.workers.EnvWorkers` (the trainer's side) starts the **host**, a fresh
interpreter (``python -c`` :data:`BOOT`: the trainer's ``sys.path``, then :func:`main`), which imports
the environment's module once (``task.env``'s spec, with :func:`arlopti.tasks.user_code.load_function`)
and then forks one **episode process** per episode on the trainer's request. An episode process builds
its instance at its first call and holds it until the episode ends, so ``reset``, ``step``, the tools,
``get_reward`` and ``close`` of an episode reach the same instance; nothing else runs in it. The host
itself never calls the environment (it only imports its module and forks), so an episode that exits,
crashes or hangs takes down its own process only.

**Why a host that forks** (and not a fresh interpreter per episode, nor the math grader's pool of
:mod:`arlopti.tasks.math.pool`): importing an environment costs about 0.5 s of CPU
(``arlopti.tasks.env`` alone), once per host here instead of once per episode; a fork of the host costs
milliseconds. The grader's pool runs stateless calls on any free worker, while an environment's
instance must stay in one process; and a worker holding several episodes would take them all down with
one hung call. The host is single-threaded (no thread to break a fork) and is not the trainer
(forking a trainer that holds CUDA and threads is unsafe).

**Protocol** (pickled tuples over the standard library's :class:`multiprocessing.connection.Connection`
on two pipes, trainer <-> host, and a socket pair per episode, host <-> episode):

* host -> trainer at start: ``("ready", pid)`` or ``("load_error", text)`` (then it exits);
* trainer -> host: ``("open", keys)`` forks one episode process per key; ``("call", key, cid, raw)``
  forwards ``raw`` (the pickled ``(cid, method, args, seed)``) to the episode ``key``; ``("kill", keys)``
  SIGKILLs those episodes' process groups; ``("end", keys, timeout_s)`` asks them to ``close`` and exit,
  killing any still there after ``timeout_s``; ``None`` or end of file: kill every episode and exit
  (the trainer died or closed the host);
* host -> trainer: ``("result", key, cid, raw)`` (``raw``: the episode's pickled ``(status, payload)``,
  passed on unread, so the host never unpickles what user code returned; the trainer reads every message
  with :func:`~arlopti.tasks.env.calls.plain_loads`, which builds plain values only, never an object) or ``("died", key, cid, code)``
  when the episode's process ended during the call ``cid`` (``code``: its exit code, negative for a signal), or
  ``("broken", key, cid, why)`` when the host killed it for breaking the protocol (below).

**No episode can wedge the host.** The host is single-threaded, so every read from an episode has a deadline
and a bound: once ``wait`` finds an episode's socket readable, its whole message must arrive within
:data:`READ_DEADLINE_S` (one ``SIGALRM`` interval timer for the message, however it trickles in) and be at most
:data:`MAX_MESSAGE_BYTES` long (``recv_bytes(maxlength)`` refuses a longer header before reading on); a write to
an episode (a call, ``close``) has the same deadline. An episode past either (a header promising 1 MB then
nothing, a trickle, a header promising 2 GB, a socket it stopped reading) is SIGKILLed and its call fails with
one line saying what it sent; the other episodes, and later batches, go on.

**An episode process** (:func:`episode_main`) puts itself in its own process group (a kill reaches what
it started), dies with the host (``PR_SET_PDEATHSIG``), closes every file descriptor but its socket,
and answers each ``(cid, method, args, seed)`` with ``("ok", value)``, ``("error", (line, traceback))``
or ``("build_error", (line, traceback))`` (its instance could not be built), after seeding Python's
``random`` with ``seed`` (the instance is built at the first call, with ``random``
seeded by that call's seed, and ``random`` is seeded again before the call itself;
:func:`arlopti.tasks.env.calls.call_env`). ``close`` ends it.
A value that cannot be pickled is an error naming its type.

**Signals.** The host ignores SIGINT and SIGTERM (Ctrl-C, or a scheduler's preemption signal to the
trainer's process group, is the trainer's business: a preempted run finishes its step with its
environment); it exits when the trainer closes its pipe or dies. An episode process runs with Python's
default handlers, in a process group of its own that such group signals do not reach.
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from arlopti.tasks.env.calls import call_env, close_env, last_line, plain_loads, plain_value

#: What the host runs (``python -c BOOT READ_FD WRITE_FD CONFIG_JSON``): the trainer's ``sys.path`` first.
BOOT = ("import json, sys; cfg = json.loads(sys.argv[3]); "
        "sys.path[:0] = [p for p in cfg['sys_path'] if p not in sys.path]; "
        "from arlopti.tasks.env.worker_host import main; sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), cfg))")

#: How long the host waits for the rest of a message once an episode has begun it (and for an episode to take a
#: message the host sends it): past it the episode's process is killed and its call fails. A well-behaved
#: episode writes a whole message at once, so this bounds a broken one's hold on the single-threaded host.
READ_DEADLINE_S = 5.0
#: The largest message an episode may send (one call's pickled result); a longer one kills its process.
MAX_MESSAGE_BYTES = 64 * 2**20


class _Deadline(Exception):
    """The host's interval timer went off during a read from (or a write to) an episode."""


def _on_alarm(signum, frame):
    raise _Deadline


def _bounded(io, deadline_s: float):
    """``io()`` interrupted by ``SIGALRM`` (:class:`_Deadline`) after ``deadline_s`` seconds: one deadline for
    the whole message, however it trickles in (a socket timeout would bound each read, not the message)."""
    signal.setitimer(signal.ITIMER_REAL, deadline_s)
    try:
        return io()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``), or exit now if it already has."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _dumps(reply: tuple, method: str) -> bytes:
    """The episode's ``(status, payload)`` as the trainer reads it (:func:`~arlopti.tasks.env.calls.plain_loads`:
    plain values only; a value of another class is an error naming its type, here, where it is still readable)."""
    try:
        data = pickle.dumps(plain_value(reply), protocol=pickle.HIGHEST_PROTOCOL)
        plain_loads(data)
        return data
    except Exception as err:  # noqa: BLE001 - an unpicklable value: its type is named
        line = (f"TypeError: {method} returned a {type(reply[1]).__name__}, which cannot be sent back to the "
                f"trainer ({last_line(err)})")
        return pickle.dumps(("error", (line, "")))


def episode_main(sock: socket.socket, factory, text: bool, host: int) -> int:
    """An episode process (module docstring); returns its exit code."""
    _die_with_parent(host)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the environment's own process: Python's defaults
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the host's read deadline is the host's, not the environment's
    fd = sock.fileno()
    os.closerange(3, fd)  # nothing of the host's (its pipes to the trainer, other episodes' sockets) stays open here
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
    conn = Connection(sock.detach())
    holder: dict = {}
    while True:
        try:
            cid, method, args, seed = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return 0
        if method == "close":
            random.seed(seed)
            close_env(holder)
            return 0
        conn.send_bytes(_dumps(call_env(holder, factory, method, args, seed, text), method))


@dataclass
class _Episode:
    pid: int
    conn: Connection
    call: int | None = None  # the id of the call it is running
    kill_at: float | None = None  # closing: killed if still there at this time


class Host:
    """The host's loop (module docstring): episodes by key, messages relayed, deaths reported."""

    def __init__(self, inbox: Connection, outbox: Connection, factory, text: bool,
                 read_deadline_s: float = READ_DEADLINE_S, max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.inbox, self.outbox, self.factory, self.text = inbox, outbox, factory, text
        self.read_deadline_s, self.max_message_bytes = float(read_deadline_s), int(max_message_bytes)
        self.episodes: dict[int, _Episode] = {}

    def serve(self) -> int:
        while True:
            now = time.monotonic()
            closing = [e.kill_at for e in self.episodes.values() if e.kill_at is not None]
            timeout = max(0.0, min(closing) - now) if closing else None
            by_conn = {e.conn: key for key, e in self.episodes.items()}
            for conn in wait([self.inbox, *by_conn], timeout):
                if conn is self.inbox:
                    try:
                        msg = self.inbox.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg is None:
                        self._kill(list(self.episodes))
                        return 0
                    self._handle(msg)
                elif by_conn[conn] in self.episodes:
                    self._from_episode(by_conn[conn])
            now = time.monotonic()
            self._kill([k for k, e in self.episodes.items() if e.kill_at is not None and e.kill_at <= now])

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "open":
            for key in msg[1]:
                self._fork(key)
        elif kind == "call":
            _, key, cid, raw = msg
            e = self.episodes.get(key)
            try:
                if e is None:
                    raise OSError("no such episode")
                e.call = cid
                _bounded(lambda: e.conn.send_bytes(raw), self.read_deadline_s)
            except _Deadline:
                self._broken(key, f"did not take its call within {self.read_deadline_s:g} s")
            except (OSError, ValueError):
                self._died(key, cid)
        elif kind == "kill":
            self._kill(msg[1])
        elif kind == "end":
            _, keys, timeout_s = msg
            for key in keys:
                self._end(key, time.monotonic() + timeout_s)

    def _end(self, key: int, kill_at: float) -> None:
        e = self.episodes.get(key)
        if e is None:
            return
        e.kill_at = kill_at
        try:
            _bounded(lambda: e.conn.send_bytes(pickle.dumps((None, "close", (), 0))), self.read_deadline_s)
        except (_Deadline, OSError, ValueError):
            self._kill([key])

    def _fork(self, key: int) -> None:
        mine, theirs = socket.socketpair()
        host = os.getpid()
        pid = os.fork()
        if pid == 0:  # the episode's process
            code = 1
            try:
                os.setpgid(0, 0)
                mine.close()
                code = episode_main(theirs, self.factory, self.text, host)
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)  # both sides set it: whichever runs first, a kill of the group reaches it
        except OSError:
            pass
        theirs.close()
        self.episodes[key] = _Episode(pid, Connection(mine.detach()))

    def _from_episode(self, key: int) -> None:
        """Relay the episode's message (it has begun one: ``wait`` found its socket readable): read whole within
        :attr:`read_deadline_s` and at most :attr:`max_message_bytes` long, or the episode is killed."""
        e = self.episodes[key]
        try:
            raw = _bounded(lambda: e.conn.recv_bytes(self.max_message_bytes), self.read_deadline_s)
        except _Deadline:
            self._broken(key, f"sent a partial message (its rest did not arrive within {self.read_deadline_s:g} s)")
            return
        except OSError as err:
            if err.errno is None:  # Connection's "bad message length": the header promised more than the bound
                self._broken(key, f"sent a message over the bound of {self.max_message_bytes} bytes")
            else:
                self._died(key, e.call)
            return
        except EOFError:
            self._died(key, e.call)
            return
        cid, e.call = e.call, None
        self.outbox.send(("result", key, cid, raw))

    def _broken(self, key: int, why: str) -> None:
        """The episode ``key`` broke the protocol (``why``): kill it, and fail its call with ``why`` if one was on."""
        cid = self.episodes[key].call if key in self.episodes else None
        self._reap(key, kill=True)
        if cid is not None:
            self.outbox.send(("broken", key, cid, why))

    def _died(self, key: int, cid: int | None) -> None:
        """The episode ``key``'s process is gone (or unreachable): reap it, and tell the trainer if a call was on."""
        code = self._reap(key, kill=True)
        if cid is not None:
            self.outbox.send(("died", key, cid, code))

    def _kill(self, keys) -> None:
        for key in keys:
            self._reap(key, kill=True)

    def _reap(self, key: int, kill: bool) -> int | None:
        e = self.episodes.pop(key, None)
        if e is None:
            return None
        e.conn.close()
        if kill:
            for send in (os.killpg, os.kill):
                try:
                    send(e.pid, signal.SIGKILL)
                    break
                except OSError:
                    continue
        try:
            return os.waitstatus_to_exitcode(os.waitpid(e.pid, 0)[1])
        except ChildProcessError:
            return None


def _raise_open_files_limit() -> None:
    """One socket per episode: the soft limit on open files goes up to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(read_fd: int, write_fd: int, cfg: dict) -> int:
    """The host (module docstring). ``cfg``: ``spec`` (a ``module:Class`` or absolute ``/file.py:Class``),
    ``text`` (the text contract), ``cwd``, ``sys_path``."""
    # Ctrl-C and a scheduler's SIGTERM to the trainer's process group are the trainer's business: the host ends
    # when the trainer closes its pipe (or exits), so a preempted run finishes its step with its environment
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        from arlopti.tasks.env import tools  # noqa: F401 - what a tool call needs, imported before the forks
        from arlopti.tasks.user_code import load_function

        factory = load_function(cfg["spec"], cwd=cfg.get("cwd"))
    except BaseException as err:  # noqa: BLE001 - the load error goes to the trainer
        outbox.send(("load_error", last_line(err)))
        return 3
    _raise_open_files_limit()
    signal.signal(signal.SIGALRM, _on_alarm)  # the deadline of every read from (and write to) an episode
    gc.freeze()  # what the host imported stays shared with the episodes (no copy-on-write by the collector)
    outbox.send(("ready", os.getpid()))
    return Host(inbox, outbox, factory, bool(cfg["text"]), cfg.get("read_deadline_s", READ_DEADLINE_S),
                cfg.get("max_message_bytes", MAX_MESSAGE_BYTES)).serve()


__all__ = ["BOOT", "Host", "episode_main", "main"]


if __name__ == "__main__":  # pragma: no cover - the host runs through BOOT
    sys.exit("run by arlopti.tasks.env.workers.EnvWorkers")
