"""One call of an environment's instance, and the in-process runner (the trainer's side of each call).

Both runners of :mod:`arlopti.rollout.env_calls` (:class:`InProcessEnvs` here, in the trainer's process, and
the worker processes of :mod:`arlopti.tasks.env.workers` / :mod:`arlopti.tasks.env.worker_host`) make a call
the same way, :func:`call_env`: an episode's instance is built (``factory()``) at its first call with
Python's ``random`` seeded by that call's seed, ``random`` is seeded again by the call's seed, and the call
is :func:`invoke`'s (``reset``, ``step``, a tool, ``get_reward``). A call is an :class:`EnvCall`; what came
of it a :class:`CallResult`.
"""

from __future__ import annotations

import io
import numbers
import pickle
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: The methods a call may name (``close`` is :func:`close_env`).
METHODS = ("reset", "step", "tool", "get_reward")


@dataclass(frozen=True)
class EnvCall:
    """One call of episode ``key``'s instance: ``method`` (``reset``, ``step``, ``tool``, ``get_reward``;
    :func:`invoke`) with ``args``, ``random`` seeded by ``seed``, counted
    under the name ``what``."""

    key: int
    method: str
    args: tuple
    seed: int
    what: str


@dataclass
class CallResult:
    """One call's outcome: its ``value``, or ``error`` (the exception's last line; ``detail``: its
    traceback) / ``timeout``. ``gone``: the episode's instance can no longer be called (a timeout, or its
    process ended); ``build_failed``: building the instance raised."""

    value: Any = None
    error: str | None = None
    timeout: bool = False
    seconds: float = 0.0
    detail: str = ""
    gone: bool = False
    build_failed: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timeout


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (None, bool, numbers, str, bytes, tuple, list, dict, set)
    and complex numbers: every other global is refused, so bytes that came from an environment's process (user code) cannot make the
    trainer run code while it reads them (the pickle documentation's "Restricting Globals")."""

    #: The only globals allowed: constructors of plain values that older pickle protocols reach by name.
    SAFE = {("builtins", "complex"): complex, ("builtins", "set"): set, ("builtins", "frozenset"): frozenset}

    def find_class(self, module: str, name: str):
        if (module, name) in self.SAFE:
            return self.SAFE[module, name]
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain value (None, bool, a number, str, bytes, "
                                     "or a tuple, list, dict or set of them)")


def plain_loads(data: bytes):
    """``pickle.loads`` of plain values only (:class:`_PlainUnpickler`): what the trainer reads from an
    environment's host or episode processes."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def plain_value(value):
    """``value`` with numbers of other types (numpy's, for example) as Python's own ``int`` / ``float`` /
    ``complex``, through tuples, lists and dicts: what an episode process sends back (:func:`plain_loads`
    refuses any other class)."""
    if isinstance(value, (bool, int, float, complex, str, bytes)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    if isinstance(value, (tuple, list)):
        return type(value)(plain_value(v) for v in value) if type(value) in (tuple, list) else value
    if type(value) is dict:
        return {plain_value(k): plain_value(v) for k, v in value.items()}
    return value


def last_line(err: BaseException) -> str:
    """``Type: message``, its first line, at most 500 characters (what an error reply shows)."""
    return f"{type(err).__name__}: {err}".strip().splitlines()[0][:500] if str(err) else type(err).__name__


def traceback_text(err: BaseException) -> str:
    """The last 4,000 characters of ``err``'s formatted traceback (the first error's detail)."""
    return "".join(traceback.format_exception(type(err), err, err.__traceback__))[-4000:]


def invoke(env, method: str, args: tuple, text: bool):
    """One call of an instance: ``reset(row)`` (text contract) or ``reset(**row)`` (TRL's), ``step(text)``,
    a tool (``args = (ToolCall,)``, run by :func:`arlopti.tasks.env.tools.call_tool`), or ``get_reward()``."""
    if method == "reset":
        (row,) = args
        return env.reset(dict(row)) if text else env.reset(**row)
    if method == "step":
        return env.step(*args)
    if method == "tool":
        from arlopti.tasks.env.tools import call_tool, tool_methods

        return call_tool(tool_methods(env), args[0])
    if method == "get_reward":
        return env.get_reward()
    raise ValueError(f"unknown environment call {method!r} (known: {', '.join(METHODS)})")


def call_env(holder: dict, factory, method: str, args: tuple, seed: int, text: bool) -> tuple[str, object]:
    """``(status, payload)`` of one call on ``holder["env"]``, built first by ``factory()`` when absent
    (``random`` seeded by ``seed`` for the build and again for the call): ``("ok", value)``,
    ``("error", (line, traceback))`` or ``("build_error", (line, traceback))``. Both placements run this."""
    if "env" not in holder:
        random.seed(seed)
        try:
            holder["env"] = factory()
        except BaseException as err:  # noqa: BLE001 - user code may raise anything
            return "build_error", (last_line(err), traceback_text(err))
    random.seed(seed)
    try:
        return "ok", invoke(holder["env"], method, args, text)
    except BaseException as err:  # noqa: BLE001 - user code may raise anything
        return "error", (last_line(err), traceback_text(err))


def close_env(holder: dict) -> None:
    """Call the instance's ``close`` if it has one (errors ignored: ``close`` is not counted)."""
    close = getattr(holder.get("env"), "close", None)
    if callable(close):
        try:
            close()
        except BaseException:  # noqa: BLE001 - user code; close is not counted
            pass


class InProcessEnvs:
    """The runner for a class no worker process can import by name (:mod:`arlopti.rollout.env_calls`):
    instances in the trainer's process (``factory`` builds one, ``text`` says the contract), one call at a
    time, each in a daemon thread joined for at most its timeout (a call past it is abandoned, not killed).
    Same interface as :class:`arlopti.tasks.env.workers.EnvWorkers`."""

    def __init__(self, factory: Callable, text: bool):
        self.factory, self.text = factory, text
        self.instances: dict[int, dict] = {}  # key -> {"env": instance} once built
        self.gone: set[int] = set()

    def open(self, keys: list[int]) -> None:
        for key in keys:
            self.instances[key] = {}

    def _call(self, c: EnvCall, timeout_s: float) -> CallResult:
        holder, box = self.instances[c.key], {}

        def target():
            box["reply"] = call_env(holder, self.factory, c.method, c.args, c.seed, self.text)

        state = random.getstate()
        t0 = time.perf_counter()
        thread = threading.Thread(target=target, name="arlopti-env", daemon=True)
        try:
            thread.start()
            thread.join(timeout_s)
        finally:
            random.setstate(state)
        seconds = time.perf_counter() - t0
        if thread.is_alive():  # abandoned: it may still run, so the instance is not called again (close included)
            self.gone.add(c.key)
            return CallResult(timeout=True, gone=True, seconds=seconds)
        status, payload = box["reply"]
        if status == "ok":
            return CallResult(value=payload, seconds=seconds)
        return CallResult(error=payload[0], detail=payload[1], seconds=seconds, build_failed=status == "build_error")

    def stream(self, jobs: list[list[EnvCall]], timeout_s: float) -> Iterator[tuple[int, int, CallResult]]:
        """One call at a time, in the jobs' order (after a timeout, that episode's later calls are not run)."""
        for j, job in enumerate(jobs):
            for k, c in enumerate(job):
                r = self._call(c, timeout_s)
                yield j, k, r
                if r.gone:
                    break

    def end(self, keys: list[int], timeout_s: float) -> None:
        """``close`` each instance that was built and did not time out (``random`` seeded 0, at most ``timeout_s``)."""
        for key in keys:
            holder = self.instances.pop(key, {})
            if key in self.gone or "env" not in holder:
                self.gone.discard(key)
                continue
            state = random.getstate()
            random.seed(0)
            thread = threading.Thread(target=close_env, args=(holder,), name="arlopti-env", daemon=True)
            try:
                thread.start()
                thread.join(timeout_s)
            finally:
                random.setstate(state)

    def kill(self, keys: list[int]) -> None:
        for key in keys:
            self.instances.pop(key, None)
            self.gone.discard(key)

    def close(self) -> None:
        self.instances.clear()


__all__ = ["METHODS", "CallResult", "EnvCall", "InProcessEnvs", "call_env", "close_env", "invoke", "last_line",
           "traceback_text"]
