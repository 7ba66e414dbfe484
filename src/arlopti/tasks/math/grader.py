"""The math reward: last ``\\boxed`` answer vs gold, by string match or an isolated symbolic check.

Pipeline for one response (everything up to step 5 runs in-process and is linear-time string work):

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

from arlopti.tasks.math.extract import MAX_RESPONSE_CHARS, cap_tail, last_boxed, strip_think
from arlopti.tasks.math.guards import MAX_ANSWER_CHARS, symbolic_risk
from arlopti.tasks.math.normalize import gold_strings, normalize_answer, plain_number
from arlopti.tasks.math.pool import WorkerPool

HOW_VALUES = ("string", "numeric", "symbolic", "mismatch", "rejected", "timeout", "error", "no_box")


@dataclass(frozen=True)
class GradeDetail:
    """The verdict on one response.

    ``extracted`` is the last boxed answer (None without a box); ``matched_gold`` the gold
    string it matched (None when ``reward == 0``); ``how`` one of :data:`HOW_VALUES`.
    """

    reward: float
    how: str
    extracted: str | None
    matched_gold: str | None = None


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

    ``timeout_s`` bounds each symbolic check (from the moment a worker receives it).
    :meth:`grade` (one response) additionally bounds its whole call by ``timeout_s`` plus the
    kill-and-reap time; :meth:`grade_batch` runs up to ``num_workers`` checks in parallel and
    bounds each one; with ``batch_budget_s`` the symbolic part of a whole batch is capped too
    (checks unfinished by then score 0 as timeouts). ``memory_limit_mb`` caps each worker's
    address space; a worker is replaced after ``max_tasks_per_worker`` checks.
    Workers start on the first symbolic check, which also waits for them to
    be ready (start-up is not counted against the timeout). Calls are serialised by a lock.
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 3.0, *,
                 think_mode: str = "after_first", max_response_chars: int = MAX_RESPONSE_CHARS,
                 max_answer_chars: int = MAX_ANSWER_CHARS, memory_limit_mb: int | None = 4096,
                 max_tasks_per_worker: int = 1000, batch_budget_s: float | None = None):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        strip_think("", think_mode)  # validates the mode
        self.timeout_s = float(timeout_s)
        self.think_mode = think_mode
        self.max_response_chars = max_response_chars
        self.max_answer_chars = max_answer_chars
        self.batch_budget_s = batch_budget_s
        self.num_workers = num_workers or default_num_workers()
        self._pool_kwargs = dict(memory_limit_mb=memory_limit_mb, max_tasks_per_worker=max_tasks_per_worker)
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    # ---- in-process part ---------------------------------------------------------------------
    def _fast(self, response: Any, golds: tuple[str, ...]) -> GradeDetail | str:
        """The verdict when no symbolic check is needed, else the extracted answer to check."""
        text = cap_tail(strip_think(_as_text(response), self.think_mode), self.max_response_chars)
        pred = last_boxed(text)
        if pred is None:
            return GradeDetail(0.0, "no_box", None)
        norm = normalize_answer(pred)
        gold_norms = [normalize_answer(g) for g in golds]
        for g, gn in zip(golds, gold_norms):
            if gn == norm and norm:
                return GradeDetail(1.0, "string", pred, g)
        value = plain_number(norm)
        if value is not None:
            gold_values = [plain_number(gn) for gn in gold_norms]
            if all(v is not None for v in gold_values):
                for g, v in zip(golds, gold_values):
                    if v == value:
                        return GradeDetail(1.0, "numeric", pred, g)
                return GradeDetail(0.0, "mismatch", pred)
        if not pred.strip() or symbolic_risk(pred, self.max_answer_chars) is not None:
            return GradeDetail(0.0, "rejected", pred)
        return pred

    # ---- public API --------------------------------------------------------------------------
    def grade_detailed(self, responses: Sequence[Any], ground_truths: Sequence[Any]) -> list[GradeDetail]:
        """One :class:`GradeDetail` per response; ``ground_truths[i]`` is a str/int/float or a list.

        Never raises on response content; raises ValueError for a ground truth of an
        unsupported type (a data bug) and for mismatched lengths.
        """
        return self._grade(responses, ground_truths, self.batch_budget_s)

    def _grade(self, responses: Sequence[Any], ground_truths: Sequence[Any],
               budget_s: float | None) -> list[GradeDetail]:
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        results: list[GradeDetail | None] = [None] * len(responses)
        jobs: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, (resp, gt) in enumerate(zip(responses, ground_truths)):
            try:
                golds = gold_strings(gt)
            except TypeError as err:
                raise ValueError(f"ground truth #{i}: {err}") from None
            verdict = self._fast(resp, golds)
            if isinstance(verdict, GradeDetail):
                results[i] = verdict
            else:
                jobs.setdefault((verdict, golds), []).append(i)
        if jobs:
            keys = list(jobs)
            with self._lock:
                pool = self._ensure_pool()
                outcomes = pool.run([("symbolic_match", key) for key in keys], self.timeout_s, budget_s)
            for (pred, golds), outcome in zip(keys, outcomes):
                index = outcome.value if outcome.status == "ok" and isinstance(outcome.value, int) else -1
                if 0 <= index < len(golds):
                    detail = GradeDetail(1.0, "symbolic", pred, golds[index])
                elif outcome.status == "ok":
                    detail = GradeDetail(0.0, "mismatch", pred)
                else:
                    detail = GradeDetail(0.0, outcome.status, pred)  # "timeout" or "error"
                for i in jobs[(pred, golds)]:
                    results[i] = detail
        return results  # type: ignore[return-value]

    def grade_batch(self, responses: Sequence[Any], ground_truths: Sequence[Any]) -> list[float]:
        """Rewards (1.0 or 0.0) for a batch, symbolic checks spread over the worker pool."""
        return [d.reward for d in self.grade_detailed(responses, ground_truths)]

    def grade(self, response: Any, ground_truth: Any) -> GradeDetail:
        """One response; the whole call is bounded by ``timeout_s`` (plus kill-and-reap time)."""
        return self._grade([response], [ground_truth], self.timeout_s)[0]

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


_DEFAULT: MathGrader | None = None
_DEFAULT_LOCK = threading.Lock()


def default_grader() -> MathGrader:
    """The module-level grader behind :func:`score_response` (created on first use, closed atexit)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathGrader()
            atexit.register(close_default_grader)
        return _DEFAULT


def close_default_grader() -> None:
    """Close the module-level grader's workers (it restarts them if used again)."""
    if _DEFAULT is not None:
        _DEFAULT.close()


def score_response_detailed(response: str, ground_truth: Any) -> GradeDetail:
    """:class:`GradeDetail` of one response under the official math reward (see module doc)."""
    return default_grader().grade(response, ground_truth)


def score_response(response: str, ground_truth: Any) -> float:
    """The official math reward of one response: 1.0 if its last boxed answer matches, else 0.0.

    ``ground_truth`` is a str, int, float or a list of those (a match with any counts).
    Never raises on any response string and returns within the grader timeout (3 s) plus
    about a second (the very first call also waits for the two workers to start, ~0.5 s).
    """
    return score_response_detailed(response, ground_truth).reward
