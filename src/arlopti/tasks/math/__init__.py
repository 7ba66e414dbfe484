"""The math task: official prompt, last-``\\boxed`` reward, isolated symbolic grading.

Public API:

* :func:`score_response` / :func:`score_response_detailed` - the reward of one response
  (``grader="official"``, the DeepScaleR / AR-Lopti rules, by default; or ``"math_verify"``;
  module-level graders, closed atexit);
* :class:`MathGrader` - batch grading through a worker pool with hard timeouts;
* :data:`GRADERS`, :func:`check_grader` - the grader names (config key ``tasks.math.grader``);
* :class:`MathTask` - the :class:`~arlopti.tasks.base.Task` registered as ``"math"``;
* :func:`build_prompt`, :data:`SUFFIX`, :data:`TEMPLATES` - the prompt.

Importing this package does not import sympy, pylatexenc or math-verify: those load only in
the grader's worker processes.

Read first: :mod:`arlopti.tasks.math.official` (the official grader's rules), then :mod:`arlopti.tasks.math.grader`.
"""

from __future__ import annotations

import logging
from typing import Any

from arlopti.tasks.base import RewardResult, Task, register_task
from arlopti.tasks.math.grader import (
    DEFAULT_GRADER,
    GRADERS,
    HOW_VALUES,
    GradeDetail,
    MathGrader,
    check_grader,
    close_default_grader,
    default_grader,
    score_response,
    score_response_detailed,
)
from arlopti.tasks.math.prompts import SUFFIX, TEMPLATES, build_prompt, prompt_text, strip_suffix

log = logging.getLogger(__name__)

#: Seconds the symbolic grading of one batch may take (``tasks.math.batch_budget_s``).
DEFAULT_BATCH_BUDGET_S = 10.0

__all__ = [
    "DEFAULT_BATCH_BUDGET_S", "DEFAULT_GRADER", "GRADERS", "HOW_VALUES", "GradeDetail", "MathGrader", "MathTask",
    "SUFFIX",
    "TEMPLATES", "build_prompt", "check_grader", "close_default_grader", "default_grader",
    "prompt_text", "score_response",
    "score_response_detailed", "strip_suffix",
]


@register_task("math")
class MathTask(Task):
    """Scores math responses: reward 1 for a matching final boxed answer, else 0.

    ``grader`` is ``"official"`` (DeepScaleR / AR-Lopti rules, the default) or
    ``"math_verify"``; an unknown name raises ValueError naming ``tasks.math.grader``.
    ``batch_budget_s`` (config ``tasks.math.batch_budget_s``, default
    :data:`DEFAULT_BATCH_BUDGET_S`; null = none) caps the symbolic grading of one :meth:`score`
    call: answers still unchecked when it runs out score 0 with ``how="budget"`` and the count is
    logged (without it a batch of distinct pathological answers costs ``timeout_s`` each). Other
    keyword arguments go to :class:`MathGrader` (``num_workers``, ``timeout_s``,
    ``think_mode``, ...). Components per response: ``boxed`` (1 if a boxed answer was found),
    ``timeout`` (1 if the symbolic check was killed at its timeout), ``budget`` (1 if the
    batch's time budget ran out before it was checked) and ``grader_official``
    (1 if the official grader produced the verdict, 0 for math-verify).
    """

    name = "math"

    def __init__(self, grader: str = DEFAULT_GRADER, batch_budget_s: float | None = DEFAULT_BATCH_BUDGET_S,
                 **grader_kwargs: Any):
        if batch_budget_s is not None and not float(batch_budget_s) > 0:
            raise ValueError(f"tasks.math.batch_budget_s must be > 0 or null, got {batch_budget_s}")
        self.grader = MathGrader(grader=grader, batch_budget_s=batch_budget_s, **grader_kwargs)

    def score(self, responses: list[str], ground_truths: list[Any], metas: list[dict]) -> list[RewardResult]:
        details = self.grader.grade_detailed(responses, ground_truths)
        over = sum(d.how == "budget" for d in details)
        if over:
            log.warning("math grading: the batch time budget (tasks.math.batch_budget_s=%s s) ran out; %d of %d "
                        "answers scored 0 unchecked (how=budget)", self.grader.batch_budget_s, over, len(details))
        return [
            RewardResult(
                reward=d.reward,
                correct=d.reward == 1.0,
                components={"boxed": float(d.how != "no_box"), "timeout": float(d.how == "timeout"),
                            "budget": float(d.how == "budget"), "grader_official": float(d.grader == "official")},
            )
            for d in details
        ]

    def extract_answer(self, response: str) -> str | None:
        """The last ``\\boxed{...}`` / ``\\fbox{...}`` content of ``response``
        (:func:`~arlopti.tasks.math.extract.last_boxed`), for eval's per-item records."""
        from arlopti.tasks.math.extract import last_boxed

        return last_boxed(response)

    def close(self) -> None:
        self.grader.close()
