"""A small process pool with a hard, killing per-task timeout.

Why not ``concurrent.futures`` or pebble: a timed-out task must die at its deadline even when
it is stuck inside one C call (a big-integer power holds the GIL, so a Python-level SIGTERM or
SIGALRM handler never runs). pebble sends SIGTERM and waits 3 s before SIGKILL; here a worker
past its deadline gets SIGKILL at once, is reaped (``wait``) and replaced, and its task scores
as a timeout. The pool is driven synchronously from :meth:`WorkerPool.run`: no background
thread in the calling process.

Each worker is a fresh interpreter running ``_worker.py`` by path (``subprocess``, no fork of
the possibly multi-threaded, CUDA-holding caller, and no re-import of the caller's
``__main__`` as multiprocessing's spawn/forkserver would do). It talks over two private pipes.
Start-up costs one interpreter plus the math-verify/sympy import (about 0.5 s of CPU), paid
once per worker and again only when a worker is killed, crashes or is retired after
``max_tasks_per_worker`` tasks.

Worker functions are named (see ``_worker.py``): ``symbolic_match`` (math-verify, module
``"symbolic"``), ``official_sympy_match`` (the official DeepScaleR sympy grader, module
``"official"``) and the ``test.*`` hooks that let tests force sleeps, C-level hangs and crashes.
``user_functions`` adds user code under names of the caller's choice (``task=custom``'s reward,
:mod:`arlopti.tasks.custom`): each worker loads the specs before it reports ready, a spec that
fails to load raises :class:`WorkerLoadError` with the worker's message, and a user function's
``"error"`` outcome carries its traceback.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Sequence

from arlopti.tasks.env.calls import plain_loads
from arlopti.tasks.outcome import TaskOutcome

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).resolve().parent / "_worker.py"
WORKER_FUNCTIONS = ("symbolic_match", "official_sympy_match", "test.sleep", "test.bigint", "test.exit",
                    "test.echo")
# Grader modules a worker can preload (see _worker.py) and what each needs installed.
WORKER_MODULES = {"symbolic": "math-verify", "official": "sympy and pylatexenc"}
_MAX_BOOT_FAILURES = 3


class WorkerLoadError(RuntimeError):
    """A worker could not load a user function (the message is the worker's: spec and cause)."""


@dataclass
class _Worker:
    proc: subprocess.Popen
    inbox: Connection  # parent -> worker
    outbox: Connection  # worker -> parent
    boot_deadline: float
    ready: bool = False
    task: int | None = None  # index into the current run's calls
    deadline: float = 0.0
    done: int = 0


class WorkerPool:
    """``num_workers`` worker processes; :meth:`run` executes named calls with a hard timeout.

    Not thread-safe: callers serialise access (``MathGrader`` holds a lock).
    ``memory_limit_mb`` caps each worker's address space (RLIMIT_AS; 0/None = no cap), so a
    runaway big-number computation fails with MemoryError instead of eating the machine.
    ``modules`` names the grader modules each worker imports before it reports ready (keys of
    :data:`WORKER_MODULES`); ``preload_symbolic=False`` loads none of them. ``user_functions``
    (``{name: "module:function" or "/abs/file.py:function"}``) are loaded too, with
    ``user_sys_path`` first on the worker's ``sys.path``; ``user_batch`` says they take lists.
    """

    def __init__(self, num_workers: int = 2, *, memory_limit_mb: int | None = 4096,
                 max_tasks_per_worker: int = 1000, boot_timeout_s: float = 60.0,
                 preload_symbolic: bool = True, modules: Sequence[str] = ("symbolic",),
                 user_functions: dict[str, str] | None = None, user_sys_path: Sequence[str] = (),
                 user_batch: bool = False):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        unknown = [m for m in modules if m not in WORKER_MODULES]
        if unknown:
            raise ValueError(f"unknown worker modules {unknown}; known: {list(WORKER_MODULES)}")
        self.num_workers = num_workers
        self.memory_limit_mb = int(memory_limit_mb or 0)
        self.max_tasks_per_worker = max_tasks_per_worker
        self.boot_timeout_s = boot_timeout_s
        # False: workers skip the math-verify import (fast start; only the test.* hooks work).
        self.preload_symbolic = preload_symbolic
        self.modules = tuple(modules) if preload_symbolic else ()
        self.user_functions = dict(user_functions or {})
        clash = [n for n in self.user_functions if n in WORKER_FUNCTIONS]
        if clash:
            raise ValueError(f"user function names {clash} clash with the built-in worker functions")
        self._user_arg = json.dumps({"functions": self.user_functions, "sys_path": list(user_sys_path),
                                     "batch": bool(user_batch)}) if self.user_functions else ""
        self._workers: list[_Worker] = []
        self._boot_failures = 0
        self._retried: set[int] = set()  # tasks of the current run already retried once
        self._closed = False
        # Recent worker pids (for leak checks in tests and benchmarks).
        self.spawned_pids: deque[int] = deque(maxlen=100_000)
        self.stats = {"spawned": 0, "killed_timeout": 0, "crashed": 0, "retired": 0, "tasks": 0}

    # ---- lifecycle ----------------------------------------------------------------------------
    def _spawn(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), str(to_child_r), str(from_child_w),
                 str(self.memory_limit_mb), ",".join(self.modules) or "0", self._user_arg],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, close_fds=True,
            )
        except OSError:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        self._workers.append(_Worker(proc, Connection(to_child_w, readable=False),
                                     Connection(from_child_r, writable=False),
                                     boot_deadline=time.monotonic() + self.boot_timeout_s))
        self.stats["spawned"] += 1
        self.spawned_pids.append(proc.pid)

    def _reap(self, w: _Worker, kill: bool) -> int | None:
        """Remove ``w`` from the pool, SIGKILL it if asked (or if it will not exit), wait for it.

        Returns its exit code.
        """
        if w in self._workers:
            self._workers.remove(w)
        for conn in (w.inbox, w.outbox):
            try:
                conn.close()
            except OSError:
                pass
        if kill and w.proc.poll() is None:
            w.proc.kill()
        try:
            return w.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            try:
                return w.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                log.error("math grader worker pid %s could not be reaped", w.proc.pid)
                return None

    def _fill(self) -> None:
        while not self._closed and len(self._workers) < self.num_workers:
            self._spawn()

    def start(self) -> None:
        """Start the workers and wait until at least one is ready (bounded by ``boot_timeout_s``)."""
        if self._closed:
            raise RuntimeError("this WorkerPool is closed")
        self._fill()
        while not any(w.ready for w in self._workers):
            self._poll(time.monotonic() + 0.5, outcomes=None, retry=None)

    def close(self) -> None:
        """Stop every worker (idle ones are asked to exit, the rest are killed) and reap them."""
        self._closed = True
        for w in list(self._workers):
            if w.ready and w.task is None:
                try:
                    w.inbox.send(None)
                    continue
                except (OSError, ValueError):
                    pass
            if w.proc.poll() is None:
                w.proc.kill()  # busy or still starting: nothing to wait for
        deadline = time.monotonic() + 0.5
        for w in list(self._workers):
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._reap(w, kill=True)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    # ---- execution ----------------------------------------------------------------------------
    def _poll(self, until: float, outcomes: list | None, retry: deque | None) -> None:
        """Wait for worker messages or deaths until ``until`` or the next deadline, then handle
        boots, results, crashes (a crashed task is queued on ``retry`` once) and timeouts."""
        active = [w for w in self._workers if w.task is not None or not w.ready]
        if active:
            wake = min([until] + [w.deadline for w in active if w.task is not None]
                       + [w.boot_deadline for w in active if not w.ready])
            ready = set(wait([w.outbox for w in active], timeout=max(0.0, wake - time.monotonic())))
            for w in active:
                if w.outbox not in ready:
                    continue
                try:  # a worker runs user code (task=custom's reward): plain values only, never an object
                    msg = plain_loads(w.outbox.recv_bytes())
                except (EOFError, OSError, pickle.UnpicklingError):
                    msg = None
                if msg is None:
                    self._on_death(w, outcomes, retry)
                elif msg[0] == "load_error":
                    self._reap(w, kill=True)
                    raise WorkerLoadError(str(msg[1]))
                elif msg[0] == "ready":
                    w.ready, self._boot_failures = True, 0
                else:
                    self._on_result(w, msg, outcomes)
        now = time.monotonic()
        for w in list(self._workers):
            if w.task is not None and now >= w.deadline:
                if outcomes is not None:  # a deadline cut short by run's budget_s (== until): error "budget"
                    outcomes[w.task] = TaskOutcome("timeout", error="budget" if w.deadline == until else "")
                self._reap(w, kill=True)
                self.stats["killed_timeout"] += 1
            elif not w.ready and now >= w.boot_deadline:
                self._reap(w, kill=True)
                self._boot_failed(f"not ready after {self.boot_timeout_s:.0f} s")
        self._fill()

    def _on_result(self, w: _Worker, msg: tuple, outcomes: list | None) -> None:
        status, task_id, value = msg
        if outcomes is not None and w.task == task_id:
            outcomes[task_id] = (TaskOutcome("ok", value) if status == "ok"
                                 else TaskOutcome("error", error=str(value)))
        w.task, w.done = None, w.done + 1
        self.stats["tasks"] += 1
        if self.max_tasks_per_worker and w.done >= self.max_tasks_per_worker:
            # Retire it: bounds whatever sympy caches or fragmentation a long run accumulates.
            try:
                w.inbox.send(None)
            except (OSError, ValueError):
                pass
            self._reap(w, kill=False)
            self.stats["retired"] += 1

    def _on_death(self, w: _Worker, outcomes: list | None, retry: deque | None) -> None:
        if w not in self._workers:
            return
        was_ready, task = w.ready, w.task
        code = self._reap(w, kill=True)
        if not was_ready:
            self._boot_failed(f"a worker exited during start-up with code {code}")
            return
        self.stats["crashed"] += 1
        if task is None or outcomes is None:
            return
        if retry is not None and task not in self._retried:
            self._retried.add(task)
            retry.append(task)
        else:
            outcomes[task] = TaskOutcome("error", error=f"worker died (exit code {code})")

    def _boot_failed(self, why: str) -> None:
        self._boot_failures += 1
        if self._boot_failures >= _MAX_BOOT_FAILURES:
            needs = "; ".join(f"{m}: {WORKER_MODULES[m]}" for m in self.modules) or "nothing"
            raise RuntimeError(
                f"grader workers failed to start {self._boot_failures} times in a row ({why}); "
                f"check that `{sys.executable} {WORKER_SCRIPT}` can import what its modules need "
                f"({needs}; e.g. pip install 'math-verify[antlr4_9_3]' pylatexenc)"
            )

    def run(self, calls: Sequence[tuple[str, tuple]], timeout_s: float,
            budget_s: float | None = None) -> list[TaskOutcome]:
        """Run ``calls`` (``(function_name, args)`` pairs) and return one outcome per call.

        Each call gets ``timeout_s`` seconds from the moment a worker receives it; past that the
        worker is killed and the outcome is ``"timeout"``. A call whose worker dies is retried
        once on a fresh worker, then reported as ``"error"``. With ``budget_s``, no call
        outlives ``start + budget_s`` either: calls not finished by then (queued or running)
        time out too (``error="budget"``), so ``run`` returns within about ``budget_s`` plus the
        kill-and-reap time.
        Worker start-up in :meth:`start` happens before the clock starts.
        """
        for name, _ in calls:
            if name not in WORKER_FUNCTIONS and name not in self.user_functions:
                raise KeyError(f"unknown worker function {name!r}; known: "
                               f"{list(WORKER_FUNCTIONS) + list(self.user_functions)}")
        if not calls:
            return []
        self.start()
        self._retried = set()
        hard_end = time.monotonic() + budget_s if budget_s is not None else float("inf")
        outcomes: list[TaskOutcome | None] = [None] * len(calls)
        pending: deque = deque(range(len(calls)))
        while pending or any(w.task is not None for w in self._workers):
            if time.monotonic() >= hard_end:
                for w in list(self._workers):
                    if w.task is not None:
                        outcomes[w.task] = TaskOutcome("timeout", error="budget")
                        self._reap(w, kill=True)
                        self.stats["killed_timeout"] += 1
                while pending:
                    outcomes[pending.popleft()] = TaskOutcome("timeout", error="budget")
                self._fill()
                break
            for w in list(self._workers):
                if not pending:
                    break
                if not (w.ready and w.task is None):
                    continue
                i = pending.popleft()
                try:
                    w.inbox.send((i, calls[i][0], calls[i][1]))
                except (OSError, ValueError):  # the worker is gone; the task goes back
                    pending.appendleft(i)
                    self._on_death(w, None, None)
                    continue
                except Exception as err:  # noqa: BLE001  (unpicklable arguments: nothing was sent)
                    outcomes[i] = TaskOutcome("error", error=type(err).__name__)
                    continue
                w.task, w.deadline = i, min(time.monotonic() + timeout_s, hard_end)
            self._poll(hard_end, outcomes, pending)
        return [o if o is not None else TaskOutcome("error", error="lost") for o in outcomes]
