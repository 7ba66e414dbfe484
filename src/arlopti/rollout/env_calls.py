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

The counts (:attr:`EnvCalls.round`: calls, errors, timeouts and the first error's text) are kept
per round (one :meth:`arlopti.rollout.turns.TurnLoop.run`); :meth:`EnvCalls.end_round` applies the
stop rule of ``task.max_error_frac`` over the last ``task.error_window`` rounds (the custom task's
rule for reward functions, :mod:`arlopti.tasks.custom`): past it the run stops with
:class:`~arlopti.tasks.env.base.EnvError` naming the environment, the failures of each call name (``step``,
a tool's name, ``get_reward``) and the first error.
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
    """The counted calls (steps and tools) of one round, their failures, and the first error's traceback."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    seconds: float = 0.0
    by_name: Counter = field(default_factory=Counter)  # calls per name ("step", a tool's name, "get_reward")
    failed_by_name: Counter = field(default_factory=Counter)


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
        (steps and tools) enter the failure counts under the name ``what``."""
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
        if result.error is not None and not r.first_error:
            r.first_error = detail or result.error

    def end_round(self) -> RoundCounts:
        """Close the round: log its failures, apply the stop rule (module docstring), start a new round."""
        r, self.round = self.round, RoundCounts()
        failed = r.errors + r.timeouts
        self.recent.append((r.calls, failed, r.by_name, r.failed_by_name))
        if failed:
            log.warning("environment %s: %d of %d calls failed this round (%d raised or were refused, %d timed out "
                        "at task.env_timeout_s=%s s)", self.name, failed, r.calls, r.errors, r.timeouts, self.timeout_s)
            if r.first_error and not self._shown:
                self._shown = True
                log.warning("environment %s: first error (later ones are only counted):\n%s", self.name,
                            r.first_error)
        self._stop_if_failing(r)
        return r

    def _stop_if_failing(self, r: RoundCounts) -> None:
        if self.max_error_frac is None or self.max_error_frac >= 1:
            return
        total = sum(c for c, *_ in self.recent)
        failed = sum(f for _, f, *_ in self.recent)
        if not total or failed / total <= self.max_error_frac:
            return
        calls, fails = Counter(), Counter()
        for _, _, c, f in self.recent:
            calls.update(c)
            fails.update(f)
        named = ", ".join(f"{k} {fails[k]} of {calls[k]}" for k in sorted(calls, key=lambda k: (-fails[k], k)))
        why = (f"First error: {r.first_error.strip().splitlines()[-1]}" if r.first_error else
               f"Every failure was a timeout (task.env_timeout_s={self.timeout_s} s per call).")
        raise EnvError(f"the environment {self.name} failed on {failed} of its {total} calls over the last "
                       f"{len(self.recent)} rollout round(s) ({named}), more than task.max_error_frac="
                       f"{self.max_error_frac}: the run stops rather than train on broken episodes. {why}\nFix the "
                       "environment, or raise task.max_error_frac (1 = never stop).")


__all__ = ["CallResult", "EnvCalls", "RoundCounts"]
