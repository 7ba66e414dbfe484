"""Calling an environment: each call bounded in time, seeded, counted; the run stops past the error bound.

:class:`EnvCalls` runs every call an episode makes of its environment (``reset``, ``step``, a tool,
``get_reward``, ``close``; :mod:`arlopti.rollout.turns`):

* in a daemon thread joined for at most ``task.env_timeout_s`` seconds. A call past it is a
  timeout; its thread cannot be killed and is abandoned (it keeps running in the background), so
  code that may hang belongs in a subprocess the environment can kill (the built-in Python tool's
  sandbox does that), as in :class:`arlopti.tasks.in_process.InProcessRunner`;
* with Python's ``random`` seeded by the caller's seed (:func:`arlopti.rollout.seeds.env_seed`) and
  the trainer's own ``random`` state put back afterwards, so an environment that draws from
  ``random`` (TRL's documented ``IncrementEnv`` does, in ``reset``) is reproducible and the G resets of
  a prompt start from the same state. Other generators (numpy's, torch's) are not touched;
* one at a time, in the episodes' order (their draws from ``random`` then never interleave).

The counts (:attr:`EnvCalls.round`: calls, errors, timeouts, per call name, and each name's first
error) are kept per round (one :meth:`arlopti.rollout.turns.TurnLoop.run`). A call's name is the
tool's (a call naming no tool of the environment, or one that could not be parsed, is ``unknown``),
or ``reset``, ``step`` or ``get_reward``; ``close`` is not counted. :meth:`EnvCalls.end_round`
applies the stop rule of ``task.max_error_frac`` to each name on its own, over the last
``task.error_window`` rounds (the custom task's rule for reward functions, :mod:`arlopti.tasks.custom`):
a name whose failures (raised, timed out, a reply refused for its size) exceed ``task.max_error_frac``
of its own calls stops the run with :class:`~arlopti.tasks.env.base.EnvError` naming the environment,
each such name with its failures and calls, the failures of every name, and the first error of the
worst. There is no minimum number of calls (as for reward functions): a name called once in the window
that failed stops the run at any ``task.max_error_frac`` below 1. A busy healthy tool does not hide a
broken one.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from arlopti.tasks.env.base import EnvError

log = logging.getLogger(__name__)


@dataclass
class CallResult:
    """One call's outcome: its ``value``, or ``error`` (the exception's last line) / ``timeout``."""

    value: Any = None
    error: str | None = None
    timeout: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timeout


@dataclass
class RoundCounts:
    """The counted calls of one round (every call but ``close``), their failures, and the first error's
    traceback, in all and per call name (module docstring)."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    seconds: float = 0.0
    by_name: Counter = field(default_factory=Counter)  # calls per name ("step", a tool's name, "get_reward", ...)
    failed_by_name: Counter = field(default_factory=Counter)
    first_error_by_name: dict = field(default_factory=dict)


def _last_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip().splitlines()[0][:500] if str(err) else type(err).__name__


class EnvCalls:
    """See the module docstring. ``name``: the environment, as messages name it."""

    def __init__(self, name: str, timeout_s: float, max_error_frac: float | None = 0.5, error_window: int = 5):
        self.name = name
        self.timeout_s = float(timeout_s)
        self.max_error_frac = max_error_frac
        self.recent: deque = deque(maxlen=int(error_window))
        self.round = RoundCounts()
        self._shown = False

    def call(self, fn: Callable, *args, seed: int, counted: bool = True, what: str = "step", **kwargs) -> CallResult:
        """``fn(*args, **kwargs)`` under the timeout with ``random`` seeded by ``seed``; ``counted`` calls
        (all but ``close``) enter the failure counts under the name ``what`` (module docstring)."""
        box: dict[str, Any] = {}

        def target():
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - user code may raise anything
                box["error"] = _last_line(err)
                box["traceback"] = "".join(traceback.format_exception(type(err), err, err.__traceback__))[-4000:]

        state = random.getstate()
        random.seed(seed)
        t0 = time.perf_counter()
        thread = threading.Thread(target=target, name="arlopti-env", daemon=True)
        try:
            thread.start()
            thread.join(self.timeout_s)
        finally:
            random.setstate(state)
        seconds = time.perf_counter() - t0
        self.round.seconds += seconds
        if thread.is_alive():
            result = CallResult(timeout=True, seconds=seconds)
        elif "error" in box:
            result = CallResult(error=box["error"], seconds=seconds)
        else:
            result = CallResult(value=box.get("value"), seconds=seconds)
        if counted:
            self.count(result, box.get("traceback", ""), what=what)
        return result

    def count(self, result: CallResult, detail: str = "", new_call: bool = True, what: str = "step") -> None:
        """Add one counted call named ``what`` to the round; ``new_call=False``: turn a call already counted
        into a failure (its reply was refused for its size)."""
        r = self.round
        r.calls += int(new_call)
        r.by_name[what] += int(new_call)
        r.failed_by_name[what] += int(not result.ok)
        r.errors += int(result.error is not None)
        r.timeouts += int(result.timeout)
        if result.error is not None:
            r.first_error = r.first_error or detail or result.error
            r.first_error_by_name.setdefault(what, detail or result.error)

    def end_round(self) -> RoundCounts:
        """Close the round: log its failures, apply the stop rule (module docstring), start a new round."""
        r, self.round = self.round, RoundCounts()
        failed = r.errors + r.timeouts
        self.recent.append(r)
        if failed:
            log.warning("environment %s: %d of %d calls failed this round (%d raised or were refused, %d timed out "
                        "at task.env_timeout_s=%s s)", self.name, failed, r.calls, r.errors, r.timeouts, self.timeout_s)
            if r.first_error and not self._shown:
                self._shown = True
                log.warning("environment %s: first error (later ones are only counted):\n%s", self.name,
                            r.first_error)
        self._stop_if_failing()
        return r

    def _stop_if_failing(self) -> None:
        """Raise past ``task.max_error_frac`` for any call name over the window (module docstring)."""
        if self.max_error_frac is None or self.max_error_frac >= 1:
            return
        calls, fails = Counter(), Counter()
        for past in self.recent:
            calls.update(past.by_name)
            fails.update(past.failed_by_name)
        failing = sorted((k for k in calls if fails[k] > self.max_error_frac * calls[k]),
                         key=lambda k: (-fails[k] / max(calls[k], 1), -calls[k], k))
        if not failing:
            return
        worst = failing[0]
        first = next((past.first_error_by_name[worst] for past in reversed(self.recent)
                      if worst in past.first_error_by_name), "")
        why = (f"First error of {worst}: {first.strip().splitlines()[-1]}" if first else
               f"Every failure of {worst} was a timeout (task.env_timeout_s={self.timeout_s} s per call).")
        named = ", ".join(f"{k} failed on {fails[k]} of its {calls[k]} calls" for k in failing)
        every = ", ".join(f"{k} {fails[k]} of {calls[k]}" for k in sorted(calls, key=lambda k: (-fails[k], k)))
        raise EnvError(f"the environment {self.name}: {named} over the last {len(self.recent)} rollout round(s), "
                       f"more than task.max_error_frac={self.max_error_frac} (every call: {every}): the run stops "
                       f"rather than train on broken episodes. {why}\nFix the environment, or raise "
                       "task.max_error_frac (1 = never stop).")


__all__ = ["CallResult", "EnvCalls", "RoundCounts"]
