"""``task=custom``: a reward function of your own, by import path or file path, no code under ``src/``.

Configured by ``configs/task/custom.yaml`` (``task.*``, which ``train.yaml`` / ``eval.yaml`` hand to
this task as ``tasks.custom``); the walk-through is ``docs/custom_task.md``.

The function (``task.reward_fn``, ``my_pkg.rewards:score`` or ``path/to/rewards.py:score``; see
:mod:`arlopti.tasks.user_code` for how it is found) has this stable signature::

    score(response: str, ground_truth, meta: dict) -> float | dict

``response`` is the decoded completion (no prompt), ``ground_truth`` the record's answer column
as read (``None`` without one), ``meta`` the record's other columns plus ``dataset``, ``split``
and ``index`` (:mod:`arlopti.data.generic_datamodule`). With ``task.batch=true`` it takes lists
instead, ``score(responses, ground_truths, metas) -> list[float | dict]``, one entry per response.

What it returns:

* a number (a bool counts as 1 or 0): the reward; ``correct = reward > task.correct_above``
  (default 0);
* a dict: ``"reward"`` (a number, required) is the reward; ``"correct"`` (bool or number), when
  present, is the correctness (else the rule above); every other key is a named component, a
  number, logged as ``reward/<key>`` (the batch mean; a response whose dict lacks a key counts 0).
  Keys may not hold ``/`` nor be ``mean``, ``std``, ``accuracy``, ``zero_std_group_frac``,
  ``error`` or ``timeout``.

Isolation (the math grader's killable pool, :class:`arlopti.tasks.math.pool.WorkerPool`): every
call runs in a worker process with a hard per-call timeout, ``task.timeout_s`` per response (a
batch call of k responses gets ``k * timeout_s``), and one :meth:`CustomTask.score` call
stops at ``task.batch_budget_s``. A call that raises, is killed at a deadline, or returns a
non-finite number scores 0 for its responses (a batch call: for all of them); each response
carries the components ``error`` / ``timeout`` (0 or 1), so ``reward/error`` and
``reward/timeout`` are the fractions per step, :attr:`CustomTask.stats` keeps the counts, every
batch with failures logs one warning with the counts, and the first traceback is logged in full.
Workers load the module before their first call (within the pool's 60 s start-up limit, not
counted against the timeouts); their standard output is discarded (print to ``sys.stderr``).

Bad input, as :class:`~arlopti.config.ConfigError`: at start-up (construction, which imports the
module in the trainer's process once, as a check), a spec that does not import (naming the spec
and the import error) or does not name a function; at the first scored batch, a function that
returns something other than a number or a dict of numbers (naming the function and the type)
while no call has yet returned a valid value. Once the function has returned valid values, a
wrong type later counts as an error (scored 0, logged) and the run goes on.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from typing import Any, Sequence

from arlopti.config import ConfigError
from arlopti.tasks.base import RewardResult, Task, register_task
from arlopti.tasks.user_code import BAD_TYPE, UserCodeError, load_function, resolve_spec

log = logging.getLogger(__name__)

#: Component names the learner's reward/* tags already use.
RESERVED_COMPONENTS = ("mean", "std", "accuracy", "zero_std_group_frac", "error", "timeout")
_FUNCTION = "user.reward"


def default_num_workers() -> int:
    """Worker processes when ``task.num_workers`` is null: ``min(4, CPUs)``."""
    return max(1, min(4, os.cpu_count() or 1))


class _BadValue(Exception):
    """A return value that is not a number / dict of numbers (message: what it was)."""


def parse_value(value: Any, correct_above: float) -> RewardResult:
    """A reward function's plain return value (:func:`arlopti.tasks.user_code.plain`) as a
    :class:`RewardResult`; raises :class:`_BadValue` for a wrong type and ValueError for a
    non-finite number or a bad component name (see the module docstring for the rules)."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == BAD_TYPE:
        raise _BadValue(f"{value[1]} ({value[2]})" if value[2] else value[1])
    if isinstance(value, dict):
        if "reward" not in value:
            raise _BadValue(f"dict without a 'reward' key (keys: {sorted(value)})")
        reward = value["reward"]
        if isinstance(reward, tuple):
            raise _BadValue(f"dict whose 'reward' is a {reward[1]}")
        components = {}
        for k, v in value.items():
            if k in ("reward", "correct"):
                continue
            if isinstance(v, tuple):
                raise _BadValue(f"dict whose {k!r} is a {v[1]}")
            if "/" in k or k in RESERVED_COMPONENTS:
                raise ValueError(f"component name {k!r} is not allowed (no '/', not one of {RESERVED_COMPONENTS})")
            components[k] = float(v)
        correct = value.get("correct")
        if isinstance(correct, tuple):
            raise _BadValue(f"dict whose 'correct' is a {correct[1]}")
    elif isinstance(value, (int, float)):  # a bool counts as 1 / 0
        reward, components, correct = value, {}, None
    else:
        raise _BadValue(type(value).__name__)
    reward = float(reward)
    if not math.isfinite(reward) or not all(math.isfinite(v) for v in components.values()):
        raise ValueError(f"non-finite value (reward {reward}, components {components})")
    ok = bool(correct) if correct is not None else reward > correct_above
    return RewardResult(reward=reward, correct=ok, components=components)


@register_task("custom")
class CustomTask(Task):
    """See the module docstring. Keyword arguments are the ``task.*`` keys of
    ``configs/task/custom.yaml``; workers start at the first :meth:`score` call."""

    name = "custom"

    def __init__(self, reward_fn: str | None = None, batch: bool = False, timeout_s: float = 10.0,
                 batch_budget_s: float | None = 60.0, num_workers: int | None = None,
                 memory_limit_mb: int | None = None, correct_above: float = 0.0,
                 max_tasks_per_worker: int = 1000):
        if not reward_fn:
            raise ConfigError("task.reward_fn is not set: the custom task needs a reward function, "
                              "task.reward_fn=my_pkg.rewards:score or task.reward_fn=path/to/rewards.py:score "
                              "(docs/custom_task.md); with data=prompts, pass task=custom task.reward_fn=...")
        if not isinstance(batch, bool):
            raise ConfigError(f"task.batch={batch!r}: expected true or false")
        for key, value, nullable in (("timeout_s", timeout_s, False), ("batch_budget_s", batch_budget_s, True)):
            if value is None and nullable:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"task.{key}={value!r}: expected a number of seconds > 0"
                                  + (" or null (no cap)" if nullable else ""))
        if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                        or num_workers < 1):
            raise ConfigError(f"task.num_workers={num_workers!r}: expected an int >= 1 or null (min(4, CPUs))")
        try:
            self.spec = resolve_spec(str(reward_fn))
            load_function(self.spec)  # the import check (module top-level code runs here once)
        except UserCodeError as err:
            raise ConfigError(f"task.reward_fn: {err}") from None
        self.reward_fn = str(reward_fn)
        self.batch = batch
        self.timeout_s = float(timeout_s)
        self.batch_budget_s = None if batch_budget_s is None else float(batch_budget_s)
        self.num_workers = num_workers or default_num_workers()
        self.correct_above = float(correct_above)
        self._pool_kwargs = dict(memory_limit_mb=memory_limit_mb or 0, max_tasks_per_worker=max_tasks_per_worker,
                                 preload_symbolic=False, user_functions={_FUNCTION: self.spec},
                                 user_sys_path=[os.getcwd()], user_batch=batch)
        self._pool = None
        self._valid_seen = False
        self._traceback_logged = False
        #: Counts over this task's life: responses scored, raised (error), killed (timeout), wrong type.
        self.stats: Counter = Counter()

    # ---- workers ------------------------------------------------------------------------------
    def _ensure_pool(self):
        from arlopti.tasks.math.pool import WorkerPool

        if self._pool is None:
            self._pool = WorkerPool(self.num_workers, **self._pool_kwargs)
        return self._pool

    def _calls(self, responses, ground_truths, metas) -> tuple[list[tuple], list[list[int]], list[float]]:
        """Worker calls, the response indices each covers, and each call's timeout."""
        n = len(responses)
        if not self.batch:
            return ([(_FUNCTION, (responses[i], ground_truths[i], metas[i])) for i in range(n)],
                    [[i] for i in range(n)], [self.timeout_s] * n)
        chunks = min(self.num_workers, n)
        bounds = [round(k * n / chunks) for k in range(chunks + 1)]
        groups = [list(range(bounds[k], bounds[k + 1])) for k in range(chunks)]
        calls = [(_FUNCTION, ([responses[i] for i in g], [ground_truths[i] for i in g], [metas[i] for i in g]))
                 for g in groups]
        return calls, groups, [self.timeout_s * len(g) for g in groups]

    def _run(self, calls, timeouts):
        from arlopti.tasks.math.pool import WorkerLoadError

        pool = self._ensure_pool()
        try:
            if len(set(timeouts)) <= 1:
                return pool.run(calls, timeouts[0] if timeouts else self.timeout_s, self.batch_budget_s)
            # batch chunks of unequal length: the longest chunk's timeout for all (they differ by one response)
            return pool.run(calls, max(timeouts), self.batch_budget_s)
        except WorkerLoadError as err:
            raise ConfigError(f"task.reward_fn: a worker could not load it: {err}") from None

    # ---- scoring ------------------------------------------------------------------------------
    def _bad_type(self, what: str) -> None:
        raise ConfigError(f"task.reward_fn={self.reward_fn}: the function {self.spec} returned a {what}; it must "
                          "return a number (the reward) or a dict with a number under 'reward' "
                          + ("(a list of those with task.batch=true)" if self.batch else
                             "(set task.batch=true if it takes lists)"))

    def score(self, responses: Sequence[str], ground_truths: Sequence[Any],
              metas: Sequence[dict]) -> list[RewardResult]:
        if not (len(responses) == len(ground_truths) == len(metas)):
            raise ValueError(f"{len(responses)} responses, {len(ground_truths)} ground truths, {len(metas)} metas")
        if not responses:
            return []
        metas = [dict(m or {}) for m in metas]
        calls, groups, timeouts = self._calls(list(responses), list(ground_truths), metas)
        outcomes = self._run(calls, timeouts)
        values: list[Any] = [None] * len(responses)
        failure: list[str] = [""] * len(responses)  # "", "error", "timeout"
        first_error = ""
        bad_types: list[str] = []
        for idx, outcome in zip(groups, outcomes):
            if outcome.status == "timeout":
                for i in idx:
                    failure[i] = "timeout"
                continue
            if outcome.status != "ok":
                first_error = first_error or outcome.error
                for i in idx:
                    failure[i] = "error"
                continue
            got = outcome.value
            if self.batch:
                if isinstance(got, tuple) or not isinstance(got, list):
                    what = got[1] if isinstance(got, tuple) else type(got).__name__
                    bad_types.append(f"{what} instead of a list")
                    for i in idx:
                        failure[i] = "error"
                    continue
                if len(got) != len(idx):
                    bad_types.append(f"list of {len(got)} values for {len(idx)} responses")
                    for i in idx:
                        failure[i] = "error"
                    continue
            else:
                got = [got]
            for i, v in zip(idx, got):
                values[i] = v
        results: list[RewardResult | None] = [None] * len(responses)
        for i, v in enumerate(values):
            if failure[i]:
                continue
            try:
                results[i] = parse_value(v, self.correct_above)
                self._valid_seen = True
            except _BadValue as err:
                bad_types.append(str(err))
                failure[i] = "error"
            except ValueError as err:
                first_error = first_error or f"returned a bad value: {err}"
                failure[i] = "error"
        if bad_types and not self._valid_seen:
            self._bad_type(bad_types[0])
        keys = sorted({k for r in results if r is not None for k in r.components})
        out = []
        for i, r in enumerate(results):
            comps = {k: (r.components.get(k, 0.0) if r is not None else 0.0) for k in keys}
            comps["error"] = float(failure[i] == "error")
            comps["timeout"] = float(failure[i] == "timeout")
            if r is None:
                out.append(RewardResult(reward=0.0, correct=False, components=comps))
            else:
                out.append(RewardResult(reward=r.reward, correct=r.correct, components=comps))
        self._account(failure, first_error, bad_types)
        return out

    def _account(self, failure: list[str], first_error: str, bad_types: list[str]) -> None:
        counts = Counter(failure)
        self.stats["responses"] += len(failure)
        self.stats["error"] += counts["error"]
        self.stats["timeout"] += counts["timeout"]
        self.stats["bad_type"] += len(bad_types)
        if not counts["error"] and not counts["timeout"]:
            return
        wrong = f", {len(bad_types)} of them a wrong type ({bad_types[0]})" if bad_types else ""
        log.warning("custom reward %s: %d of %d responses scored 0 (%d error%s, %d timed out at "
                    "task.timeout_s=%s s or task.batch_budget_s=%s s); run totals: %s", self.spec,
                    counts["error"] + counts["timeout"], len(failure), counts["error"], wrong, counts["timeout"],
                    self.timeout_s, self.batch_budget_s, dict(self.stats))
        if first_error and not self._traceback_logged:
            self._traceback_logged = True
            log.warning("custom reward %s: first error (later ones are only counted):\n%s", self.spec,
                        first_error)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
