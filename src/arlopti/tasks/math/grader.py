"""The math reward: last ``\\boxed`` answer vs gold, by string match or an isolated symbolic check.

Two graders, chosen with ``grader=`` (config key ``tasks.math.grader``):

* ``"official"`` (default): the DeepScaleR / AR-Lopti reward restated in
  :mod:`~arlopti.tasks.math.official` (in-process part) and
  :mod:`~arlopti.tasks.math.official_sympy` (worker part). For one response:

  1. coerce to ``str``; keep ``text.split("</think>")[1]`` when ``</think>`` occurs
     (:func:`~arlopti.tasks.math.official.solution_text`), then the last
     ``max_response_chars`` characters (ours);
  2. the official answer: content of the last ``\\boxed{...}``
     (:func:`~arlopti.tasks.math.official.extract_answer`); None -> 0, ``how="no_box"``;
  3. the official golds (:func:`~arlopti.tasks.math.official.official_golds`); none left ->
     0, ``how="no_gold"``;
  4. ``grade_answer_mathd`` against each gold, in-process -> 1, ``how="string"``; two plain
     integers are decided in-process too (``"numeric"`` / ``"mismatch"``, same verdict as the
     original);
  5. an answer over ``max_answer_chars`` -> 0, ``how="rejected"`` (ours); an answer the guards
     flag (power tower, huge exponent or factorial) still goes to the worker, but without
     the sympy step;
  6. ``grade_answer_sympy`` against each gold in a worker process with the hard timeout:
     match -> 1 (``"symbolic"``), none -> 0 (``"mismatch"``, or ``"rejected"`` when the guard
     skipped a sympy step the original would have run), ``"timeout"`` / ``"error"`` -> 0.

  Deviations from the original, all deliberate: the original grades the decoded
  prompt + response and we grade the response alone (the same for our prompts, which hold no
  ``</think>``; without a box in the response the original finds the prompt's empty
  ``\\boxed{}``, and both give 0 unless a gold normalises to the empty string); the size cap,
  the guards and the timeout (the original has none and can hang); a data-bug gold raises.

* ``"math_verify"``: our earlier grader (math-verify in the worker), pipeline below. Its
  ``</think>`` rule defaults to ``think_mode="after_first"``.

Pipeline of ``"math_verify"`` for one response (everything up to step 5 runs in-process and is
linear-time string work):

1. coerce to ``str`` (never raises), keep the text after ``</think>`` (see
   :func:`~arlopti.tasks.math.extract.strip_think` for the two modes), keep the last
   ``max_response_chars`` characters;
2. take the last ``\\boxed{...}``/``\\fbox{...}``; none -> reward 0, ``how="no_box"``;
3. gold(s) -> strings (integral floats as ints, ``\\boxed`` unwrapped, a list = any of them);
4. Hendrycks-normalised string equality with any gold -> 1 (``how="string"``); when the answer
   and every gold are plain decimals, exact numeric comparison decides (``how="numeric"`` or
   ``"mismatch"``) with no symbolic step;
5. the guards (:func:`~arlopti.tasks.math.guards.symbolic_risk`): an answer over
   ``max_answer_chars`` or with a power tower / huge exponent / huge factorial gets 0
   (``how="rejected"``);
6. otherwise math-verify runs in a worker process of :class:`~arlopti.tasks.math.pool.WorkerPool`
   with a hard timeout: match -> 1 (``"symbolic"``), no match -> 0 (``"mismatch"``), killed at
   the timeout -> 0 (``"timeout"``), worker error -> 0 (``"error"``).

Reward is 1 for a match, else 0; there is no format reward. Identical (answer, golds) pairs
within one batch are checked once.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from arlopti.tasks.math import official
from arlopti.tasks.math.extract import MAX_RESPONSE_CHARS, cap_tail, last_boxed, strip_think
from arlopti.tasks.math.guards import MAX_ANSWER_CHARS, symbolic_risk
from arlopti.tasks.math.normalize import gold_strings, normalize_answer, plain_number
from arlopti.tasks.math.pool import WorkerPool

HOW_VALUES = ("string", "numeric", "symbolic", "mismatch", "rejected", "timeout", "budget", "error", "no_box",
              "no_gold")
GRADERS = ("official", "math_verify")
DEFAULT_GRADER = "official"
# The </think> rule each grader uses unless think_mode is given.
_DEFAULT_THINK_MODE = {"official": "official", "math_verify": "after_first"}
# Worker module and function of each grader's symbolic step (see _worker.py).
_WORKER = {"official": ("official", "official_sympy_match"), "math_verify": ("symbolic", "symbolic_match")}


def check_grader(grader: Any) -> str:
    """Return ``grader`` when it names a known grader, else raise ValueError naming the key."""
    if not isinstance(grader, str) or grader not in GRADERS:
        raise ValueError(f"tasks.math.grader: unknown grader {grader!r}; known graders: "
                         + ", ".join(repr(g) for g in GRADERS))
    return grader


@dataclass(frozen=True)
class GradeDetail:
    """The verdict on one response.

    ``extracted`` is the last boxed answer (None without a box); ``matched_gold`` the gold
    string it matched (None when ``reward == 0``); ``how`` one of :data:`HOW_VALUES`;
    ``grader`` the grader that produced the verdict (one of :data:`GRADERS`).
    """

    reward: float
    how: str
    extracted: str | None
    matched_gold: str | None = None
    grader: str = "math_verify"


def _as_text(response: Any) -> str:
    if isinstance(response, str):
        return response
    if isinstance(response, (bytes, bytearray)):
        return bytes(response).decode("utf-8", errors="replace")
    try:
        return str(response)
    except Exception:  # noqa: BLE001  (a hostile __str__)
        return ""


def default_num_workers() -> int:
    """``min(2, number of CPUs)``."""
    return max(1, min(2, os.cpu_count() or 1))


class MathGrader:
    """Grades responses against gold answers; owns the worker pool. Use as a context manager.

    ``grader`` picks the rules: ``"official"`` (DeepScaleR / AR-Lopti, the default) or
    ``"math_verify"`` (see the module doc); an unknown name raises ValueError.
    ``think_mode`` (see :func:`~arlopti.tasks.math.extract.strip_think`) defaults to the
    grader's own rule: ``"official"`` for the official grader, ``"after_first"`` for math-verify.

    ``timeout_s`` bounds each symbolic check (from the moment a worker receives it).
    :meth:`grade` (one response) additionally bounds its whole call by ``timeout_s`` plus the
    kill-and-reap time; :meth:`grade_batch` runs up to ``num_workers`` checks in parallel and
    bounds each one; with ``batch_budget_s`` the symbolic part of a whole batch is capped too
    (checks unfinished by then, queued or running, score 0 with ``how="budget"``; identical
    (answer, golds) pairs are still checked once). ``memory_limit_mb`` caps each worker's
    address space; a worker is replaced after ``max_tasks_per_worker`` checks.
    Workers start on the first symbolic check, which also waits for them to
    be ready (start-up is not counted against the timeout). Calls are serialised by a lock.
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 3.0, *,
                 grader: str = DEFAULT_GRADER, think_mode: str | None = None,
                 max_response_chars: int = MAX_RESPONSE_CHARS,
                 max_answer_chars: int = MAX_ANSWER_CHARS, memory_limit_mb: int | None = 4096,
                 max_tasks_per_worker: int = 1000, batch_budget_s: float | None = None):
        self.grader = check_grader(grader)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if think_mode is None:
            think_mode = _DEFAULT_THINK_MODE[self.grader]
        strip_think("", think_mode)  # validates the mode
        self.timeout_s = float(timeout_s)
        self.think_mode = think_mode
        self.max_response_chars = max_response_chars
        self.max_answer_chars = max_answer_chars
        self.batch_budget_s = batch_budget_s
        self.num_workers = num_workers or default_num_workers()
        self._pool_kwargs = dict(memory_limit_mb=memory_limit_mb, max_tasks_per_worker=max_tasks_per_worker,
                                 modules=(_WORKER[self.grader][0],))
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    # ---- in-process part ---------------------------------------------------------------------
    def _detail(self, reward: float, how: str, pred: str | None, gold: str | None = None) -> GradeDetail:
        return GradeDetail(reward, how, pred, gold, self.grader)

    def _golds(self, ground_truth: Any) -> tuple[str, ...]:
        if self.grader == "official":
            return official.official_golds(ground_truth)
        return gold_strings(ground_truth)

    def _fast(self, response: Any, golds: tuple[str, ...]) -> GradeDetail | tuple:
        """The verdict when no worker check is needed, else the worker call's arguments."""
        text = _as_text(response)
        if self.think_mode == "official":
            # The official rule in its own restatement; strip_think(text, "official") is the same.
            text = official.solution_text(text)
        else:
            text = strip_think(text, self.think_mode)
        text = cap_tail(text, self.max_response_chars)
        if self.grader == "official":
            return self._fast_official(text, golds)
        return self._fast_math_verify(text, golds)

    def _fast_official(self, text: str, golds: tuple[str, ...]) -> GradeDetail | tuple:
        """Steps 2-5 of the official grader (module doc): box, golds, mathd, integers, guards."""
        pred = official.extract_answer(text)
        if pred is None:
            return self._detail(0.0, "no_box", None)
        if not golds:
            return self._detail(0.0, "no_gold", pred)
        for g in golds:
            if official.grade_mathd(pred, g):
                return self._detail(1.0, "string", pred, g)
        verdicts = [official.plain_int_verdict(pred, g) for g in golds]
        if all(v is not None for v in verdicts):
            for g, v in zip(golds, verdicts):
                if v:
                    return self._detail(1.0, "numeric", pred, g)
            return self._detail(0.0, "mismatch", pred)
        risk = symbolic_risk(pred, self.max_answer_chars)
        if risk == "too_long":
            return self._detail(0.0, "rejected", pred)
        return (pred, golds, risk is None)

    def _fast_math_verify(self, text: str, golds: tuple[str, ...]) -> GradeDetail | tuple:
        """Steps 2-5 of the math-verify grader (module doc)."""
        pred = last_boxed(text)
        if pred is None:
            return self._detail(0.0, "no_box", None)
        norm = normalize_answer(pred)
        gold_norms = [normalize_answer(g) for g in golds]
        for g, gn in zip(golds, gold_norms):
            if gn == norm and norm:
                return self._detail(1.0, "string", pred, g)
        value = plain_number(norm)
        if value is not None:
            gold_values = [plain_number(gn) for gn in gold_norms]
            if all(v is not None for v in gold_values):
                for g, v in zip(golds, gold_values):
                    if v == value:
                        return self._detail(1.0, "numeric", pred, g)
                return self._detail(0.0, "mismatch", pred)
        if not pred.strip() or symbolic_risk(pred, self.max_answer_chars) is not None:
            return self._detail(0.0, "rejected", pred)
        return (pred, golds)

    # ---- public API --------------------------------------------------------------------------
    def grade_detailed(self, responses: Sequence[Any], ground_truths: Sequence[Any]) -> list[GradeDetail]:
        """One :class:`GradeDetail` per response; ``ground_truths[i]`` is a str/int/float or a list.

        Never raises on response content; raises ValueError for a ground truth of an
        unsupported type (a data bug) and for mismatched lengths.
        """
        return self._grade(responses, ground_truths, self.batch_budget_s)

    def _grade(self, responses: Sequence[Any], ground_truths: Sequence[Any],
               budget_s: float | None, budget_how: str | None = "budget") -> list[GradeDetail]:
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        results: list[GradeDetail | None] = [None] * len(responses)
        jobs: dict[tuple, list[int]] = {}
        for i, (resp, gt) in enumerate(zip(responses, ground_truths)):
            try:
                golds = self._golds(gt)
            except TypeError as err:
                raise ValueError(f"ground truth #{i}: {err}") from None
            verdict = self._fast(resp, golds)
            if isinstance(verdict, GradeDetail):
                results[i] = verdict
            else:
                jobs.setdefault(verdict, []).append(i)
        if jobs:
            keys = list(jobs)
            function = _WORKER[self.grader][1]
            with self._lock:
                pool = self._ensure_pool()
                outcomes = pool.run([(function, key) for key in keys], self.timeout_s, budget_s)
            for key, outcome in zip(keys, outcomes):
                pred, golds = key[0], key[1]
                index = outcome.value if outcome.status == "ok" and isinstance(outcome.value, int) else -1
                if 0 <= index < len(golds):
                    detail = self._detail(1.0, "symbolic", pred, golds[index])
                elif outcome.status == "ok":
                    # -2: the official worker skipped a sympy step at our guard's request.
                    detail = self._detail(0.0, "rejected" if index == -2 else "mismatch", pred)
                elif outcome.status == "timeout" and outcome.error == "budget" and budget_how is not None:
                    detail = self._detail(0.0, budget_how, pred)  # the batch budget ran out first
                else:
                    detail = self._detail(0.0, outcome.status, pred)  # "timeout" or "error"
                for i in jobs[key]:
                    results[i] = detail
        return results  # type: ignore[return-value]

    def grade_batch(self, responses: Sequence[Any], ground_truths: Sequence[Any]) -> list[float]:
        """Rewards (1.0 or 0.0) for a batch, symbolic checks spread over the worker pool."""
        return [d.reward for d in self.grade_detailed(responses, ground_truths)]

    def grade(self, response: Any, ground_truth: Any) -> GradeDetail:
        """One response; the whole call is bounded by ``timeout_s`` (plus kill-and-reap time)."""
        return self._grade([response], [ground_truth], self.timeout_s, budget_how=None)[0]  # a timeout

    def _ensure_pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.num_workers, **self._pool_kwargs)
        return self._pool

    @property
    def pool(self) -> WorkerPool | None:
        """The worker pool once started (None before the first symbolic check)."""
        return self._pool

    def close(self) -> None:
        """Stop and reap all worker processes. The grader can be used again (it restarts them)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DEFAULTS: dict[str, MathGrader] = {}
_DEFAULT_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def default_grader(grader: str = DEFAULT_GRADER) -> MathGrader:
    """The module-level grader of kind ``grader`` behind :func:`score_response` (created on
    first use, closed atexit)."""
    global _ATEXIT_REGISTERED
    check_grader(grader)
    with _DEFAULT_LOCK:
        if grader not in _DEFAULTS:
            _DEFAULTS[grader] = MathGrader(grader=grader)
            if not _ATEXIT_REGISTERED:
                atexit.register(close_default_grader)
                _ATEXIT_REGISTERED = True
        return _DEFAULTS[grader]


def close_default_grader() -> None:
    """Close the module-level graders' workers (they restart them if used again)."""
    for g in list(_DEFAULTS.values()):
        g.close()


def score_response_detailed(response: str, ground_truth: Any, grader: str = DEFAULT_GRADER) -> GradeDetail:
    """:class:`GradeDetail` of one response under the math reward ``grader`` (see module doc)."""
    return default_grader(grader).grade(response, ground_truth)


def score_response(response: str, ground_truth: Any, grader: str = DEFAULT_GRADER) -> float:
    """The math reward of one response: 1.0 if its last boxed answer matches, else 0.0.

    ``grader="official"`` (default) is the DeepScaleR / AR-Lopti reward; ``"math_verify"``
    our math-verify grader; anything else raises ValueError. ``ground_truth`` is a str, int,
    float or a list of those (a match with any counts). Never raises on any response string
    and returns within the grader timeout (3 s) plus about a second (the very first call also
    waits for the two workers to start, ~0.5 s).
    """
    return score_response_detailed(response, ground_truth, grader).reward
