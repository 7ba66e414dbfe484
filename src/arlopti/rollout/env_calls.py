"""Calling an environment: each call bounded in time, seeded, counted; the run stops past the error bound.

:class:`EnvCalls` runs every call an episode makes of its environment (``reset``, ``step``, a tool,
``get_reward``, ``close``; :mod:`arlopti.rollout.turns`) in batches (:meth:`EnvCalls.run`: per episode
its calls in order, one batch per phase of a round: the resets, each turn's answers, the rewards), on one
of two runners:

* **worker processes** (:class:`arlopti.tasks.env.workers.EnvWorkers`), for a class a fresh interpreter
  can import by name (``task.env=file.py:Class`` or ``module:Class``, or a class handed to
  ``arlopti.run(env=...)`` defined at the top level of an importable module): one process per episode,
  holding its instance; the episodes' calls of a batch all run at once, each killed at
  ``task.env_timeout_s``. A call past it, or whose process ended (``os._exit``, a crash, a signal),
  fails (a one-line error naming the environment's class and the call), its episode's process is gone and
  the episode's environment is not called again. A hung ``step`` costs one timeout per batch;
* **in the trainer's process** (:class:`~arlopti.tasks.env.calls.InProcessEnvs`), the fallback for a class a worker cannot import
  by name (one defined in a notebook, in the running script's ``__main__``, inside a function): one call
  at a time, in the episodes' order, each in a daemon thread joined for at most ``task.env_timeout_s``.
  A call past it is a timeout whose thread cannot be killed (it is abandoned and keeps running), and an
  environment that exits the process ends the run: a warning says so when the loop is built.

Either way each call runs with Python's ``random`` seeded by the caller's seed
(:func:`arlopti.rollout.seeds.env_seed`; in the trainer's process its own ``random`` state is put back
afterwards), so an environment that draws from ``random`` (TRL's documented ``IncrementEnv`` does, in
``reset``) is reproducible and the G resets of a prompt start from the same state; an instance is built
(``Cls()``) at its episode's first call, with ``random`` seeded by that call's seed too
(:func:`arlopti.tasks.env.calls.call_env`, the one function both runners call). Other generators
(numpy's, torch's) are not touched.

The counts (:attr:`EnvCalls.round`: calls, errors, timeouts, per call name, and each name's first error)
are kept per round (one :meth:`arlopti.rollout.turns.TurnLoop.run`), added in the episodes' order once a
batch is done (so the first error does not depend on which call finished first). A call's name is the
tool's (a call naming no tool of the environment, or one that could not be parsed, is ``unknown``), or
``reset``, ``step`` or ``get_reward``; ``close`` is not counted.

**The stop rule** (``task.max_error_frac`` over the last ``task.error_window`` rounds, applied to each name
on its own; the custom task's rule for reward functions, :mod:`arlopti.tasks.custom`): a name whose
failures (raised, timed out, its process gone, a reply refused for its size) exceed
``task.max_error_frac`` of its own calls stops the run with :class:`~arlopti.tasks.env.base.EnvError`
naming the environment, each such name with its failures and calls, the failures of every name, and the
first error of the worst. It is applied at the round's end (:meth:`EnvCalls.end_round`), and also as the
failures come in (after each failed call of a batch, :meth:`EnvCalls.run`, and before each later turn is
generated, :meth:`EnvCalls.check`) as soon as the outcome is certain: when a name's failures exceed
``task.max_error_frac`` of the most calls it can have by the round's end (its calls so far, those still
to come in the batch, and at most what the episodes still running can make: ``more(name)`` per episode,
from :mod:`arlopti.rollout.turns`). An early stop is therefore one the round's end would have made too,
only sooner (when every episode's process died or hung, at once). There is no minimum number of calls
(as for reward functions): a name called once in the window that failed stops the run at any
``task.max_error_frac`` below 1. A busy healthy tool does not hide a broken one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from arlopti.tasks.env.base import EnvError
from arlopti.tasks.env.calls import CallResult, EnvCall, InProcessEnvs

log = logging.getLogger(__name__)


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


class EnvCalls:
    """See the module docstring. ``name``: the environment, as messages name it; ``runner``: an
    :class:`~arlopti.tasks.env.calls.InProcessEnvs` or :class:`~arlopti.tasks.env.workers.EnvWorkers`; ``fallback``: a function
    giving the in-process runner to use when the workers cannot import the class (a ``callable:`` spec),
    or None (then that is an :class:`~arlopti.tasks.env.base.EnvError`)."""

    def __init__(self, name: str, timeout_s: float, max_error_frac: float | None = 0.5, error_window: int = 5,
                 runner=None, fallback: Callable[[], InProcessEnvs] | None = None):
        self.name = name
        self.timeout_s = float(timeout_s)
        self.max_error_frac = max_error_frac
        self.recent: deque = deque(maxlen=int(error_window))
        self.round = RoundCounts()
        self.runner, self.fallback = runner, fallback
        self._shown = False

    # ------------------------------------------------------------------ running calls
    def open(self, keys: list[int]) -> None:
        """Make room for one instance per episode key (a process each, on the workers)."""
        from arlopti.tasks.env.workers import EnvWorkerLoadError

        try:
            self.runner.open(keys)
        except EnvWorkerLoadError as err:
            if self.fallback is None:
                raise EnvError(f"the environment {self.name}: its worker process could not import it ({err}); "
                               "task.env must name a class a fresh Python process can import") from None
            log.warning("environment %s: a worker process could not import it (%s), so it runs in the trainer's "
                        "process: no kill at task.env_timeout_s and no protection from a crash", self.name, err)
            self.runner = self.fallback()
            self.runner.open(keys)

    def run(self, jobs: list[list[EnvCall]], more: Callable[[str], float] | None = None,
            fatal: bool = False) -> tuple[list[list[CallResult | None]], float]:
        """Run ``jobs`` (per episode its calls, in order) and count them; returns each call's result (None: not
        run) and the batch's wall seconds. After each failed call, the stop rule is applied as far as it is
        already certain (module docstring; ``more(name)``: the most calls of that name each episode still
        running may make after this batch); ``fatal``: the first failure ends the batch (the calls still
        running are killed) and the caller raises."""
        results: list[list[CallResult | None]] = [[None] * len(job) for job in jobs]
        pending = Counter(c.what for job in jobs for c in job)
        calls, fails = self._window()
        alive = sum(1 for job in jobs if job)
        per = more or (lambda name: 0.0)
        stopped = False
        t0 = time.perf_counter()
        stream = self.runner.stream(jobs, self.timeout_s)
        try:
            for j, k, r in stream:
                results[j][k], what = r, jobs[j][k].what
                pending[what], calls[what], fails[what] = pending[what] - 1, calls[what] + 1, fails[what] + (not r.ok)
                if r.gone:
                    alive -= 1
                    pending.subtract(c.what for c in jobs[j][k + 1:])
                if not r.ok and (fatal or self._certain(calls, fails, lambda n: pending[n] + (alive * per(n) if alive
                                                                                              else 0.0))):
                    stopped = True
                    break
        finally:
            stream.close()
        wall = time.perf_counter() - t0
        self.round.seconds += wall
        for job, res in zip(jobs, results):
            for c, r in zip(job, res):
                if r is not None:
                    self.count(r, r.detail, what=c.what)
        if stopped and not fatal:
            self._stop_if_failing(self._rounds_so_far(), early=True)
        return results, wall

    def end(self, keys: list[int]) -> None:
        """The episodes are over: their instances' ``close`` (not counted), then they are forgotten."""
        self.runner.end(keys, self.timeout_s)

    def close(self) -> None:
        """Release the runner (the workers' processes)."""
        self.runner.close()

    # ------------------------------------------------------------------ counting and the stop rule
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

    def _rounds_so_far(self) -> list[RoundCounts]:
        """The earlier rounds that stay in the window at this round's end, then this round so far."""
        keep = (self.recent.maxlen or 1) - 1
        return (list(self.recent)[-keep:] if keep else []) + [self.round]

    def _window(self) -> tuple[Counter, Counter]:
        calls, fails = Counter(), Counter()
        for past in self._rounds_so_far():
            calls.update(past.by_name)
            fails.update(past.failed_by_name)
        return calls, fails

    def _certain(self, calls: Counter, fails: Counter, more: Callable[[str], float]) -> bool:
        """Whether some name's failures already exceed ``task.max_error_frac`` of the most calls it can reach."""
        if self.max_error_frac is None or self.max_error_frac >= 1:
            return False
        return any(fails[k] > 0 and fails[k] > self.max_error_frac * (calls[k] + more(k)) for k in fails)

    def check(self, more: Callable[[str], float]) -> None:
        """The stop rule between batches, where already certain (``more(name)``: the most calls of that name
        the rest of the round can make, over all its running episodes; module docstring)."""
        calls, fails = self._window()
        if self._certain(calls, fails, more):
            self._stop_if_failing(self._rounds_so_far(), early=True)

    def end_round(self) -> RoundCounts:
        """Close the round: log its failures, apply the stop rule (module docstring), start a new round."""
        r, self.round = self.round, RoundCounts()
        failed = r.errors + r.timeouts
        self.recent.append(r)
        if failed:
            log.warning("environment %s: %d of %d calls failed this round (%d raised, ended their process or were "
                        "refused, %d timed out at task.env_timeout_s=%s s)", self.name, failed, r.calls, r.errors,
                        r.timeouts, self.timeout_s)
            if r.first_error and not self._shown:
                self._shown = True
                log.warning("environment %s: first error (later ones are only counted):\n%s", self.name,
                            r.first_error)
        self._stop_if_failing(list(self.recent))
        return r

    def _stop_if_failing(self, rounds: list[RoundCounts], early: bool = False) -> None:
        """Raise past ``task.max_error_frac`` for any call name over ``rounds`` (module docstring)."""
        if self.max_error_frac is None or self.max_error_frac >= 1:
            return
        calls, fails = Counter(), Counter()
        for past in rounds:
            calls.update(past.by_name)
            fails.update(past.failed_by_name)
        failing = sorted((k for k in calls if fails[k] > self.max_error_frac * calls[k]),
                         key=lambda k: (-fails[k] / max(calls[k], 1), -calls[k], k))
        if not failing:
            return
        worst = failing[0]
        first = next((past.first_error_by_name[worst] for past in reversed(rounds)
                      if worst in past.first_error_by_name), "")
        why = (f"First error of {worst}: {first.strip().splitlines()[-1].rstrip('.')}." if first else
               f"Every failure of {worst} was a timeout (task.env_timeout_s={self.timeout_s} s per call).")
        named = ", ".join(f"{k} failed on {fails[k]} of its {calls[k]} calls" for k in failing)
        every = ", ".join(f"{k} {fails[k]} of {calls[k]}" for k in sorted(calls, key=lambda k: (-fails[k], k)))
        so_far = (" (the last one so far: the calls its running episodes could still make would not bring it "
                  "under the limit)") if early else ""
        raise EnvError(f"the environment {self.name}: {named} over the last {len(rounds)} rollout round(s){so_far}, "
                       f"more than task.max_error_frac={self.max_error_frac} (every call: {every}): the run stops "
                       f"rather than train on broken episodes. {why}\nFix the environment, or raise "
                       "task.max_error_frac (1 = never stop).")


__all__ = ["CallResult", "EnvCall", "EnvCalls", "InProcessEnvs", "RoundCounts"]  # the first two and the fourth: tasks.env.calls
