"""Reward callables handed over in Python (``arlopti.run(reward_fn=...)``, :mod:`arlopti.entry.api`).

A callable cannot travel in a config, so :func:`register_callable` keeps it in this process under
a key and returns the spec ``callable:<key>`` that ``task.reward_fn`` / ``task.reward_fns`` carry.
:class:`arlopti.tasks.custom.CustomTask` then runs it one of two ways (:func:`placement`):

* **in the killable worker pool**, as a ``task.reward_fn`` string would, when a fresh interpreter
  can import it by name: a function defined at the top level of an importable module file
  (``my_pkg.rewards.score``), its spec becoming ``module:qualname``;
* **in the trainer's process** otherwise (a function defined in a notebook, in the running
  script's ``__main__``, a lambda, a closure, a ``functools.partial``): :class:`InProcessRunner`
  calls it in a daemon thread with the same per-call timeout, budget, error and NaN accounting.
  A call past its timeout scores 0 and counts as a timeout, but it cannot be killed: its thread is
  abandoned and keeps running in the background (a worker process would have been killed).
"""

from __future__ import annotations

import importlib
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from arlopti.tasks.outcome import TaskOutcome

CALLABLE_PREFIX = "callable:"
_REGISTRY: dict[str, Callable] = {}


def register_callable(function: Callable) -> str:
    """The spec ``callable:<key>`` under which ``function`` is kept for this process."""
    if not callable(function):
        raise TypeError(f"reward_fn: expected a callable, got {type(function).__name__}")
    name = getattr(function, "__name__", type(function).__name__)
    key = f"{name if name.isidentifier() else 'fn'}_{id(function):x}"
    _REGISTRY[key] = function
    return CALLABLE_PREFIX + key


def is_callable_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(CALLABLE_PREFIX)


def lookup(spec: str) -> Callable:
    """The callable a ``callable:<key>`` spec names (KeyError when this process never registered it:
    such a spec only works within the ``arlopti.run`` call that made it)."""
    key = spec[len(CALLABLE_PREFIX):]
    if key not in _REGISTRY:
        raise KeyError(f"{spec!r}: no callable of that name in this process (a callable reward is passed to "
                       "arlopti.run(reward_fn=...) in Python; from the command line give module:function)")
    return _REGISTRY[key]


def importable_spec(function: Callable) -> str | None:
    """``module:qualname`` when a fresh interpreter can import ``function`` by name (module
    docstring), else None."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname or "." in qualname:
        return None
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except Exception:  # noqa: BLE001 - a module that does not import by name stays in-process
        return None
    if found is not function or getattr(importlib.import_module(module), "__file__", None) is None:
        return None
    return f"{module}:{qualname}"


def placement(spec: str) -> tuple[str, Callable | None]:
    """``(spec for the worker pool, None)`` or ``(display name, the callable to run in-process)``
    for a reward spec (a plain ``module:function`` string goes to the pool unchanged)."""
    if not is_callable_spec(spec):
        return spec, None
    function = lookup(spec)
    importable = importable_spec(function)
    if importable is not None:
        return importable, None
    name = getattr(function, "__qualname__", getattr(function, "__name__", type(function).__name__))
    return f"{getattr(function, '__module__', '?')}.{name} (in-process)", function


def _traceback_text(err: BaseException) -> str:
    tb = err.__traceback__
    if tb is not None and tb.tb_next is not None:  # drop this module's own frame
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))


class InProcessRunner:
    """:meth:`arlopti.tasks.math.pool.WorkerPool.run`'s contract for callables of this process
    (``functions``: name -> callable; ``batch``: they take lists). Calls run one at a time, each in
    a daemon thread joined for at most its timeout (and the budget left)."""

    def __init__(self, functions: dict[str, Callable], batch: bool = False):
        self.functions = dict(functions)
        self.batch = batch

    def _call(self, function: Callable, args: tuple, wait_s: float):
        from arlopti.tasks.user_code import plain

        box: dict[str, Any] = {}

        def target():
            try:
                box["value"] = plain(function(*args), batch=self.batch)
            except BaseException as err:  # noqa: BLE001 - user code may raise anything
                box["error"] = _traceback_text(err)[-4000:]

        thread = threading.Thread(target=target, name="arlopti-reward", daemon=True)
        thread.start()
        thread.join(wait_s)
        return None if thread.is_alive() else box

    def run(self, calls: Sequence[tuple[str, tuple]], timeout_s: float, budget_s: float | None = None) -> list:
        end = time.monotonic() + budget_s if budget_s is not None else float("inf")
        outcomes = []
        for name, args in calls:
            left = end - time.monotonic()
            if left <= 0:
                outcomes.append(TaskOutcome("timeout", error="budget"))
                continue
            box = self._call(self.functions[name], args, min(timeout_s, left))
            if box is None:
                outcomes.append(TaskOutcome("timeout", error="budget" if left < timeout_s else ""))
            elif "error" in box:
                outcomes.append(TaskOutcome("error", error=box["error"]))
            else:
                outcomes.append(TaskOutcome("ok", box["value"]))
        return outcomes

    def close(self) -> None:
        """Nothing to release (an abandoned call's thread is a daemon)."""
