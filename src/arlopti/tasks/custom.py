"""``task=custom``: a reward function of your own, by import path or file path, no code under ``src/``.

Configured by ``configs/task/custom.yaml`` (``task.*``, which ``train.yaml`` / ``eval.yaml`` hand to
this task as ``tasks.custom``); the walk-through is ``docs/custom_task.md``.

The function (``task.reward_fn``, ``my_pkg.rewards:score`` or ``path/to/rewards.py:score``; see
:mod:`arlopti.tasks.user_code` for how it is found) has this stable signature::

    score(response: str, ground_truth, meta: dict) -> float | dict

``response`` is the decoded completion (no prompt), ``ground_truth`` the record's answer column
as read (``None`` without one), ``meta`` the record's other columns plus ``dataset``, ``split``
and ``index`` (:mod:`arlopti.data.generic_datamodule`) and ``prompt``, the record's chat messages or its
raw text (:func:`arlopti.tasks.base.with_prompt`; the rollout and validation add it). With
``task.batch=true`` it takes lists instead, ``score(responses, ground_truths, metas) -> list[float | dict]``,
one entry per response.

What it returns:

* a number (a bool counts as 1 or 0): the reward; ``correct = reward > task.correct_above``
  (default 0);
* a dict: ``"reward"`` (a number, required) is the reward; ``"correct"`` (bool or number), when
  present, is the correctness (else the rule above); every other key is a named component, a
  number, logged as ``reward/<key>`` (the batch mean; a response whose dict lacks a key counts 0).
  Keys may not hold ``/`` nor be ``mean``, ``std``, ``accuracy``, ``zero_std_group_frac``,
  ``error`` or ``timeout``.

Several functions (``task.reward_fns=[spec, ...]``, ``task.reward_weights=[w, ...]``, default all
1; TRL's ``reward_funcs`` / ``reward_weights``): the reward is ``sum_j w_j r_j`` with ``r_j = 0``
where function j failed; each function's reward is the component ``<name>`` (its function name,
made unique) and its other keys ``<name>.<key>``; ``correct`` is the AND of the ``"correct"`` keys
the functions returned, or ``total > task.correct_above`` when none did. The built-in rewards are
functions of :mod:`arlopti.tasks.builtin_rewards`. A ``callable:<key>`` spec is a Python callable
given to ``arlopti.run`` (:mod:`arlopti.tasks.in_process`: the pool when importable by name, else
in-process with the same accounting).

A learned reward model (``task.reward_model=<folder or hub name>``, :mod:`arlopti.tasks.reward_model`) is
one more entry of that list, the last one, scored in the trainer's process on the trainer's device (or
``task.reward_model_device``) from each response's prompt (``meta["prompt"]``) and text; its weight is the
last of ``task.reward_weights`` and its component ``reward_model`` (a list of models: one entry each, the
last weights, ``reward_model``, ``reward_model_2``, ...). Without ``task.reward_fn`` /
``task.reward_fns`` it is the reward. A forward that raises fails the batch's responses (counted, the stop
rule below), a non-finite score the response.

TRL's convention: a function whose first two parameters are named ``prompts`` and ``completions``
(:func:`arlopti.tasks.user_code.trl_convention`; e.g. the judge of :mod:`arlopti.tasks.judge`) is called as
TRL calls its ``reward_funcs``, ``f(prompts=[...], completions=[...], ground_truth=[...], **columns)``, one
list entry per response of its chunk (chunks as with ``task.batch=true``, whatever ``task.batch`` says):
``prompts`` are the records' prompts (chat messages, or the text of a raw-text record), ``completions``
the decoded responses, and each of the records' meta keys is a column (a list, None where a record lacks
it). It returns ``list[float | dict | None]``; None is TRL's "does not apply": the response adds 0 for
that function, without an error (counted in :attr:`CustomTask.stats` as ``none:<name>``, one warning per
batch).

Isolation (the math grader's killable pool, :class:`arlopti.tasks.math.pool.WorkerPool`): every
call runs in a worker process with a hard per-call timeout, ``task.timeout_s`` per response (a
batch call of k responses gets ``k * timeout_s``), and one :meth:`CustomTask.score` call
stops at ``task.batch_budget_s``. A call that raises, is killed at a deadline, or returns a
non-finite number scores 0 for its responses (a batch call: for all of them); each response
carries the components ``error`` / ``timeout`` (0 or 1), so ``reward/error`` and
``reward/timeout`` are the fractions per step, :attr:`CustomTask.stats` keeps the counts, every
batch with failures logs one warning with the counts, and the first traceback is shown once per
process. The stop rule: a function that failed (error or timeout) on more than
``task.max_error_frac`` (default 0.5; 1 or null: never) of the responses of the last
``task.error_window`` (default 5) batches raises :class:`RewardFailureError` naming it, the
setting and its first traceback (which is then not logged separately).
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
import sys
from collections import Counter, deque
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from arlopti.config import ConfigError
from arlopti.tasks.base import RewardResult, Task, register_task
from arlopti.tasks.user_code import BAD_TYPE, UserCodeError, load_function, resolve_spec, trl_call, trl_convention

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


class RewardFailureError(RuntimeError):
    """A reward function failed on more than ``task.max_error_frac`` of the responses of the last
    ``task.error_window`` batches: the run stops. The message is one line (what ``train.py`` shows of
    a failure) naming the function, the setting and the first error; that error's traceback is
    logged once just before (``train.log`` and the console)."""


@dataclass
class RewardFunction:
    """One reward function of the task: its component ``name`` (``reward/<name>`` with several),
    the ``spec`` shown in messages, its ``weight``, its worker-function ``key`` and, for a callable
    that cannot go to a worker, the callable itself (``in_process``); ``trl``: it follows TRL's
    convention (module docstring); ``model``: the entry is ``task.reward_model``
    (:class:`arlopti.tasks.reward_model.RewardModel`), scored in this process."""

    name: str
    spec: str
    weight: float
    key: str
    in_process: Callable | None = None
    valid_seen: bool = False
    trl: bool = False
    model: Any = None


def _model_list(reward_model) -> list[str]:
    """``task.reward_model``: none, one folder or hub name, or a list of them (several weighted models)."""
    if reward_model is None or reward_model == "":
        return []
    if isinstance(reward_model, str):
        return [reward_model]
    if isinstance(reward_model, SequenceABC) and reward_model and all(isinstance(m, str) and m for m in reward_model):
        return list(reward_model)
    raise ConfigError(f"task.reward_model={reward_model!r}: expected a reward model's folder or hub name, or a list "
                      "of them, e.g. task.reward_model=[/models/helpful-rm,/models/safe-rm]")


def _spec_list(reward_fn, reward_fns, reward_model=None) -> list[str]:
    if reward_fn and reward_fns:
        raise ConfigError(f"task.reward_fn={reward_fn} and task.reward_fns={list(reward_fns)}: give one of them "
                          "(reward_fns for several)")
    if reward_fns is not None and (isinstance(reward_fns, str) or not isinstance(reward_fns, SequenceABC)):
        raise ConfigError(f"task.reward_fns={reward_fns!r}: expected a list, e.g. [mod:fn_a,rewards.py:fn_b]")
    specs = [reward_fn] if reward_fn else list(reward_fns or [])
    if not specs and not reward_model:
        raise ConfigError("task.reward_fn is not set: the custom task needs a reward function, "
                          "task.reward_fn=my_pkg.rewards:score or task.reward_fn=path/to/rewards.py:score "
                          "(docs/custom_task.md), or several as task.reward_fns=[...]; with data=prompts, pass "
                          "task=custom task.reward_fn=...; or a reward model, task.reward_model=<folder>")
    return [str(s) for s in specs]


def _weight_list(reward_weights, n: int) -> list[float]:
    if reward_weights is None:
        return [1.0] * n
    if isinstance(reward_weights, str) or not isinstance(reward_weights, SequenceABC):
        raise ConfigError(f"task.reward_weights={reward_weights!r}: expected a list of numbers, one per reward "
                          "function")
    weights = list(reward_weights)
    if len(weights) != n or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                    and math.isfinite(w) for w in weights):
        raise ConfigError(f"task.reward_weights={weights}: expected {n} finite number(s), one per reward function "
                          "(then one per task.reward_model entry, last)")
    return [float(w) for w in weights]


def _component_name(spec: str, function: Callable | None, taken: set[str]) -> str:
    base = getattr(function, "__name__", None) if function is not None else spec.rpartition(":")[2]
    base = base if base and base.isidentifier() else "fn"
    if base in RESERVED_COMPONENTS:
        base = f"fn_{base}"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _build_functions(specs: list[str], weights: list[float]) -> list[RewardFunction]:
    from arlopti.tasks.in_process import placement

    functions, taken = [], set()
    for j, (raw, weight) in enumerate(zip(specs, weights)):
        key = "task.reward_fn" if len(specs) == 1 else f"task.reward_fns[{j}]"
        try:
            spec, in_process = placement(raw)
            if in_process is None:
                spec = resolve_spec(spec)
                function = load_function(spec)  # the import check (module top-level code runs here once)
            else:
                function = in_process
        except (UserCodeError, KeyError) as err:
            raise ConfigError(f"{key}: {err.args[0] if isinstance(err, KeyError) else err}") from None
        name = _component_name(spec.split(" ")[0], in_process, taken)
        functions.append(RewardFunction(name=name, spec=spec, weight=weight, key=f"{_FUNCTION}.{j}",
                                        in_process=in_process, trl=trl_convention(function)))
    return functions


def _model_entries(models: list[str], weights: list[float], taken: set[str], **options) -> list[RewardFunction]:
    """``task.reward_model``'s entries, after the functions in the reward list, in order (checked now, each
    loaded at its first batch): named ``reward_model``, ``reward_model_2``, ... (their ``reward/<name>`` tags)."""
    from arlopti.tasks.reward_model import RewardModel

    entries = []
    for j, (path, weight) in enumerate(zip(models, weights)):
        key = "reward_model" if len(models) == 1 else f"reward_model.{j}"
        spec = f"task.reward_model={path}" if len(models) == 1 else f"task.reward_model[{j}]={path}"
        model = RewardModel(str(path), **options)
        entries.append(RewardFunction(name=_component_name("reward_model", None, taken), spec=spec, weight=weight,
                                      key=key, model=model))
    return entries


def _trl_arguments(responses, ground_truths, metas) -> tuple:
    """TRL's arguments for responses: ``(prompts, completions, columns)``, the columns being ``ground_truth``
    and every meta key but ``prompt`` (None where a record lacks it)."""
    keys = sorted({k for m in metas for k in m if k != "prompt"} - {"ground_truth"})
    columns = {"ground_truth": list(ground_truths), **{k: [m.get(k) for m in metas] for k in keys}}
    return [m.get("prompt") for m in metas], list(responses), columns


def _check_options(batch, timeout_s, batch_budget_s, num_workers, max_error_frac, error_window) -> None:
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
    if max_error_frac is not None and (isinstance(max_error_frac, bool) or not isinstance(max_error_frac, (int, float))
                                       or not 0 <= max_error_frac <= 1):
        raise ConfigError(f"task.max_error_frac={max_error_frac!r}: expected a fraction in [0, 1] (1 or null: "
                          "never stop)")
    if isinstance(error_window, bool) or not isinstance(error_window, int) or error_window < 1:
        raise ConfigError(f"task.error_window={error_window!r}: expected an int >= 1 (batches)")


def _worker_sys_path() -> list[str]:
    """The workers' ``sys.path`` head: the current directory, then this process's own entries, so a
    callable imported by name here (a module a notebook put on ``sys.path``) imports there too."""
    return [os.getcwd()] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]


#: Reward specs whose first traceback this process has shown (rollout and validation build a task
#: each: the traceback is still shown once).
_SHOWN_TRACEBACKS: set[str] = set()


@register_task("custom")
class CustomTask(Task):
    """See the module docstring. Keyword arguments are the ``task.*`` keys of
    ``configs/task/custom.yaml``; workers start at the first :meth:`score` call."""

    name = "custom"

    def __init__(self, reward_fn: str | None = None, batch: bool = False, timeout_s: float = 10.0,
                 batch_budget_s: float | None = 60.0, num_workers: int | None = None,
                 memory_limit_mb: int | None = None, correct_above: float = 0.0,
                 max_tasks_per_worker: int = 1000, reward_fns: Sequence[str] | None = None,
                 reward_weights: Sequence[float] | None = None, max_error_frac: float | None = 0.5,
                 error_window: int = 5, reward_model: str | None = None, reward_model_device: str | None = None,
                 reward_model_dtype: str | None = None, reward_model_batch_size: int = 16,
                 reward_model_trust_remote_code: bool = False):
        models = _model_list(reward_model)
        specs = _spec_list(reward_fn, reward_fns, models)
        weights = _weight_list(reward_weights, len(specs) + len(models))
        _check_options(batch, timeout_s, batch_budget_s, num_workers, max_error_frac, error_window)
        self.functions = _build_functions(specs, weights[:len(specs)])
        self.functions += _model_entries(models, weights[len(specs):], {f.name for f in self.functions},
                                         device=reward_model_device, dtype=reward_model_dtype,
                                         batch_size=reward_model_batch_size,
                                         trust_remote_code=reward_model_trust_remote_code)
        self.spec = self.functions[0].spec if len(self.functions) == 1 else ", ".join(f.spec for f in self.functions)
        self.reward_fn = str(reward_fn) if reward_fn else None
        self.batch = batch
        self.timeout_s = float(timeout_s)
        self.batch_budget_s = None if batch_budget_s is None else float(batch_budget_s)
        self.num_workers = num_workers or default_num_workers()
        self.correct_above = float(correct_above)
        self.max_error_frac = None if max_error_frac is None else float(max_error_frac)
        self.error_window = error_window
        pooled = {f.key: f.spec for f in self.functions if f.in_process is None and f.model is None}
        self._pool_kwargs = dict(memory_limit_mb=memory_limit_mb or 0, max_tasks_per_worker=max_tasks_per_worker,
                                 preload_symbolic=False, user_functions=pooled,
                                 user_sys_path=_worker_sys_path(), user_batch=batch)
        self._pool = None
        self._recent: deque = deque(maxlen=error_window)  # (responses, {name: failures}) per batch
        #: Counts over this task's life: responses scored, raised (error), killed (timeout), wrong type;
        #: with several functions also ``error:<name>`` / ``timeout:<name>``.
        self.stats: Counter = Counter()

    def place(self, device, precision: str) -> None:
        """The trainer's device and precision: where ``task.reward_model`` runs unless its keys say otherwise."""
        for f in self.functions:
            if f.model is not None:
                f.model.place(device, precision)

    # ---- workers ------------------------------------------------------------------------------
    def _ensure_pool(self):
        from arlopti.tasks.math.pool import WorkerPool

        if self._pool is None:
            self._pool = WorkerPool(self.num_workers, **self._pool_kwargs)
        return self._pool

    def _calls(self, f: RewardFunction, responses, ground_truths, metas
               ) -> tuple[list[tuple], list[list[int]], list[float]]:
        """Calls of the function ``f``, the response indices each covers, and each call's timeout."""
        n, key = len(responses), f.key
        if f.model is not None:
            return [], [], []
        if not (self.batch or f.trl):
            return ([(key, (responses[i], ground_truths[i], metas[i])) for i in range(n)],
                    [[i] for i in range(n)], [self.timeout_s] * n)
        chunks = min(self.num_workers, n)
        bounds = [round(k * n / chunks) for k in range(chunks + 1)]
        groups = [list(range(bounds[k], bounds[k + 1])) for k in range(chunks)]
        pick = (lambda xs, g: [xs[i] for i in g])
        if f.trl:
            calls = [(key, _trl_arguments(pick(responses, g), pick(ground_truths, g), pick(metas, g))) for g in groups]
        else:
            calls = [(key, (pick(responses, g), pick(ground_truths, g), pick(metas, g))) for g in groups]
        return calls, groups, [self.timeout_s * len(g) for g in groups]

    def _run(self, calls, timeouts):
        """Outcomes of ``calls``: the pooled functions' in the worker pool (one run, so they overlap),
        the in-process ones' in :class:`~arlopti.tasks.in_process.InProcessRunner`."""
        from arlopti.tasks.in_process import InProcessRunner
        from arlopti.tasks.math.pool import WorkerLoadError

        local = {f.key: f for f in self.functions if f.in_process is not None}
        # batch chunks of unequal length: the longest chunk's timeout for all (they differ by one response)
        timeout = max(timeouts) if timeouts else self.timeout_s
        outcomes: list = [None] * len(calls)
        pooled = [i for i, (key, _) in enumerate(calls) if key not in local]
        if pooled:
            try:
                got = self._ensure_pool().run([calls[i] for i in pooled], timeout, self.batch_budget_s)
            except WorkerLoadError as err:
                raise ConfigError(f"task.reward_fn: a worker could not load it: {err}") from None
            for i, o in zip(pooled, got):
                outcomes[i] = o
        in_proc = [i for i in range(len(calls)) if i not in set(pooled)]
        for trl in (False, True):  # a TRL-convention callable is called with keywords and returns a list
            idx = [i for i in in_proc if local[calls[i][0]].trl == trl]
            if not idx:
                continue
            functions = {k: trl_call(f.in_process) if trl else f.in_process for k, f in local.items() if f.trl == trl}
            got = InProcessRunner(functions, self.batch or trl).run([calls[i] for i in idx], timeout,
                                                                   self.batch_budget_s)
            for i, o in zip(idx, got):
                outcomes[i] = o
        return outcomes

    # ---- scoring ------------------------------------------------------------------------------
    def _bad_type(self, function: RewardFunction, what: str) -> None:
        key = "task.reward_fn" if len(self.functions) == 1 else "task.reward_fns"
        raise ConfigError(f"{key}={function.spec}: the function {function.spec} returned a {what}; it must "
                          "return a number (the reward) or a dict with a number under 'reward' "
                          + ("(a list of those, or None, one per completion: TRL's convention)" if function.trl else
                             "(a list of those with task.batch=true)" if self.batch else
                             "(set task.batch=true if it takes lists)"))

    def _collect(self, f: RewardFunction, groups, outcomes, n: int):
        """One function's raw values per response, its failures ("", "error", "timeout"), its first
        error text and the wrong types it returned."""
        values: list[Any] = [None] * n
        failure: list[str] = [""] * n
        first_error, bad_types = "", []
        for idx, outcome in zip(groups, outcomes):
            if outcome.status != "ok":
                if outcome.status != "timeout":
                    first_error = first_error or outcome.error
                for i in idx:
                    failure[i] = "timeout" if outcome.status == "timeout" else "error"
                continue
            got = outcome.value
            if self.batch or f.trl:
                bad = (f"{got[1] if isinstance(got, tuple) else type(got).__name__} instead of a list"
                       if isinstance(got, tuple) or not isinstance(got, list) else
                       f"list of {len(got)} values for {len(idx)} responses" if len(got) != len(idx) else "")
                if bad:
                    bad_types.append(bad)
                    for i in idx:
                        failure[i] = "error"
                    continue
            else:
                got = [got]
            for i, v in zip(idx, got):
                values[i] = v
        return values, failure, first_error, bad_types

    def _parse(self, function: RewardFunction, values, failure, first_error, bad_types):
        """Parsed :class:`RewardResult` (None where failed) and whether each set ``correct`` itself."""
        results: list[RewardResult | None] = [None] * len(values)
        explicit = [False] * len(values)
        nones = 0
        for i, v in enumerate(values):
            if failure[i]:
                continue
            if function.trl and isinstance(v, tuple) and v[:2] == (BAD_TYPE, "NoneType"):
                nones += 1  # TRL's "does not apply": 0 in the sum, not an error
                continue
            try:
                results[i] = parse_value(v, self.correct_above)
                explicit[i] = isinstance(v, dict) and "correct" in v
                function.valid_seen = True
            except _BadValue as err:
                bad_types.append(str(err))
                failure[i] = "error"
            except ValueError as err:
                first_error = first_error or f"returned a bad value: {err}"
                failure[i] = "error"
        if bad_types and not function.valid_seen:
            self._bad_type(function, bad_types[0])
        if nones:
            self.stats[f"none:{function.name}"] += nones
            log.warning("custom reward %s returned None (TRL's 'does not apply') for %d of %d responses: they add 0 "
                        "for it", function.spec, nones, len(values))
        return results, explicit, first_error

    def _score_model(self, function: RewardFunction, responses, metas):
        """``_collect``'s tuple for ``task.reward_model``: its scores, or every response failed with the
        forward's traceback."""
        import traceback

        n = len(responses)
        try:
            values = function.model.score([m.get("prompt") for m in metas], list(responses))
            return values, [""] * n, "", []
        except ConfigError:  # the model is not what it claims (no trained head, remote code): never scored
            raise
        except Exception as err:  # noqa: BLE001 - out of memory, a missing prompt ...: counted, the stop rule
            return [None] * n, ["error"] * n, "".join(traceback.format_exception(err))[-4000:], []

    def score(self, responses: Sequence[str], ground_truths: Sequence[Any],
              metas: Sequence[dict]) -> list[RewardResult]:
        if not (len(responses) == len(ground_truths) == len(metas)):
            raise ValueError(f"{len(responses)} responses, {len(ground_truths)} ground truths, {len(metas)} metas")
        if not responses:
            return []
        n = len(responses)
        metas = [dict(m or {}) for m in metas]
        calls, groups, timeouts = [], [], []
        for f in self.functions:
            c, g, t = self._calls(f, list(responses), list(ground_truths), metas)
            calls.append(c), groups.append(g), timeouts.append(t)
        outcomes = self._run([c for cs in calls for c in cs], [t for ts in timeouts for t in ts]) if any(calls) else []
        per_function, start = [], 0
        for f, c, g in zip(self.functions, calls, groups):
            if f.model is not None:
                values, failure, first_error, bad_types = self._score_model(f, responses, metas)
            else:
                values, failure, first_error, bad_types = self._collect(f, g, outcomes[start:start + len(c)], n)
            start += len(c)
            results, explicit, first_error = self._parse(f, values, failure, first_error, bad_types)
            per_function.append((f, results, explicit, failure, first_error, bad_types))
        out = self._combine(per_function, n)
        self._account(per_function)
        return out

    def _combine(self, per_function, n: int) -> list[RewardResult]:
        """Single function: its reward and components; several: the weighted sum and each function's
        other keys as ``<name>.<key>``. Always each function's own reward as the component ``<name>`` (its
        ``reward/<name>`` tag, alone too, unless a key of its own has that name) and ``error`` / ``timeout``:
        1 when a function raised / timed out on the response."""
        single = len(per_function) == 1
        keys = [sorted({k for r in results if r is not None for k in r.components})
                for _, results, *_ in per_function]
        out = []
        for i in range(n):
            total, comps, corrects = 0.0, {}, []
            for (f, results, explicit, failure, *_), fkeys in zip(per_function, keys):
                r = results[i]
                total += f.weight * (r.reward if r is not None else 0.0)
                prefix = "" if single else f"{f.name}."
                comps.update({prefix + k: (r.components.get(k, 0.0) if r is not None else 0.0) for k in fkeys})
                comps.setdefault(f.name, r.reward if r is not None else 0.0)
                if r is not None and (explicit[i] or single):
                    corrects.append(r.correct)
            failures = [pf[3][i] for pf in per_function]
            comps["error"] = float("error" in failures)
            comps["timeout"] = float("timeout" in failures)
            if single:
                correct = bool(corrects) and corrects[0]
            else:
                correct = all(corrects) if corrects else total > self.correct_above
            out.append(RewardResult(reward=total, correct=correct, components=comps))
        return out

    def _account(self, per_function) -> None:
        """Counts, one warning per batch with failures, the first traceback once, and the stop rule
        (:class:`RewardFailureError` past ``task.max_error_frac`` over ``task.error_window`` batches)."""
        n = len(per_function[0][3])
        any_error = [any(pf[3][i] == "error" for pf in per_function) for i in range(n)]
        any_timeout = [any(pf[3][i] == "timeout" for pf in per_function) and not any_error[i] for i in range(n)]
        self.stats["responses"] += n
        self.stats["error"] += sum(any_error)
        self.stats["timeout"] += sum(any_timeout)
        batch_failures = {}
        for f, _, _, failure, first_error, bad_types in per_function:
            counts = Counter(failure)
            self.stats["bad_type"] += len(bad_types)
            if len(per_function) > 1:
                self.stats[f"error:{f.name}"] += counts["error"]
                self.stats[f"timeout:{f.name}"] += counts["timeout"]
            batch_failures[f.name] = counts["error"] + counts["timeout"]
            if counts["error"] or counts["timeout"]:
                wrong = f", {len(bad_types)} of them a wrong type ({bad_types[0]})" if bad_types else ""
                log.warning("custom reward %s: %d of %d responses scored 0 (%d error%s, %d timed out at "
                            "task.timeout_s=%s s or task.batch_budget_s=%s s); run totals: %s", f.spec,
                            counts["error"] + counts["timeout"], n, counts["error"], wrong, counts["timeout"],
                            self.timeout_s, self.batch_budget_s, dict(self.stats))
        self._recent.append((n, batch_failures))
        for f, _, _, failure, first_error, _ in per_function:
            self._stop_if_failing(f, first_error)
            if first_error and f.spec not in _SHOWN_TRACEBACKS:
                _SHOWN_TRACEBACKS.add(f.spec)
                log.warning("custom reward %s: first error (later ones are only counted):\n%s", f.spec,
                            first_error)

    def _stop_if_failing(self, function: RewardFunction, first_error: str) -> None:
        if self.max_error_frac is None or self.max_error_frac >= 1:
            return
        total = sum(n for n, _ in self._recent)
        failed = sum(fails.get(function.name, 0) for _, fails in self._recent)
        if not total or failed / total <= self.max_error_frac:
            return
        if first_error and function.spec not in _SHOWN_TRACEBACKS:  # the traceback once, in the log
            _SHOWN_TRACEBACKS.add(function.spec)
            log.error("custom reward %s: first error:\n%s", function.spec, first_error.rstrip())
        if first_error:  # the error itself stays one line: what a command line shows of a failure
            error = f"First error (its traceback is logged above): {first_error.strip().splitlines()[-1]}"
        else:
            error = f"Every failure was a timeout (task.timeout_s={self.timeout_s} s per response)."
        raise RewardFailureError(
            f"the reward function {function.spec} failed on {failed} of {total} responses over the last "
            f"{len(self._recent)} scored batch(es), more than task.max_error_frac={self.max_error_frac}: the run "
            f"stops rather than train on zero rewards. {error} Fix the function, or raise task.max_error_frac "
            "(1 = never stop).")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def reset_shown_tracebacks() -> None:
    """Forget which first tracebacks were shown (a new run in the same process shows them again)."""
    _SHOWN_TRACEBACKS.clear()
