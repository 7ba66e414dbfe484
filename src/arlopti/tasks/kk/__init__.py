"""Knights-and-Knaves logic puzzles: logical form, solver, generator, English, CoT, prompts, reward.

Public API::

    Puzzle, build_puzzle                      # records (official mem-kk-logic / Logic-RL schema)
    solve, count_solutions                    # brute force over 2^N assignments
    sample_puzzles, sample_logical_puzzles    # the original sampling distribution
    cot_trace, sft_response, cot_steps        # backtracking trace for SFT
    build_prompt, PromptPieces, TEMPLATES     # "official" (the record's own prompt), "qwen-instruct", "base"
    score_response, score_response_detailed, KKScore   # the Logic-RL reward
    KKTask                                    # registered as task "kk"; KKTask(official_cut=...)

Evaluation metrics (accuracy, format rate, per set and mode) are computed by :mod:`arlopti.eval.runner`.

Read first: :mod:`arlopti.tasks.kk.puzzle` (the record), then :mod:`arlopti.tasks.kk.reward` (the official scorer).
"""

from __future__ import annotations

from typing import Any

from arlopti.tasks.base import RewardResult, Task, register_task
from arlopti.tasks.kk.cot import CotStep, cot_steps, cot_trace, sft_response
from arlopti.tasks.kk.generator import (MAX_PEOPLE, MIN_PEOPLE, OFFICIAL_SEED, sample_logical_puzzles,
                                        sample_puzzles)
from arlopti.tasks.kk.logic import evaluate, format_statements, parse_statements, validate_statements
from arlopti.tasks.kk.prompts import (OFFICIAL, SYSTEM_PROMPT, TEMPLATES, PromptPieces, build_prompt,
                                      official_prompt)
from arlopti.tasks.kk.puzzle import Puzzle, build_puzzle
from arlopti.tasks.kk.reward import (CORRECT_TOTAL, KKScore, extract_last_answer, format_ok, parse_answer,
                                     parse_gold, score_response, score_response_detailed, scored_text)
from arlopti.tasks.kk.solver import count_solutions, solve


@register_task("kk")
class KKTask(Task):
    """Scores responses with the Logic-RL rule; the ground truth is ``solution_text_format``.

    ``official_cut`` (config ``tasks.kk.official_cut``; ``fidelity=official`` sets it): score a
    response that contains "Assistant:" on what follows its first "Assistant:", as the official
    ``compute_score`` does; exact for the ``official`` and ``qwen-instruct`` prompts (see
    :mod:`arlopti.tasks.kk.reward`). Default False: score ``"<think>" + response`` as is.
    """

    name = "kk"

    def __init__(self, official_cut: bool = False):
        if not isinstance(official_cut, bool):
            raise ValueError(f"official_cut must be true or false, got {official_cut!r}")
        self.official_cut = official_cut

    def score(self, responses: list[str], ground_truths: list[Any], metas: list[dict]) -> list[RewardResult]:
        """One :class:`RewardResult` per response: ``reward`` in {3, -0.5, -1, -3}, ``correct`` =
        reward == 3, components ``format_ok`` and ``parsed`` (0/1) and ``answer_score``.

        A ground truth may also be a mapping holding ``solution_text_format`` (the verl layout).
        Raises ``ValueError`` only for a ground truth with no parsable line (a data bug).
        """
        if len(responses) != len(ground_truths):
            raise ValueError(f"KKTask.score: {len(responses)} responses but {len(ground_truths)} "
                             "ground truths")
        out = []
        for response, gold in zip(responses, ground_truths):
            if isinstance(gold, dict):
                gold = gold.get("solution_text_format", "")
            s = score_response_detailed(response, gold, self.official_cut)
            out.append(RewardResult(
                reward=s.total, correct=s.correct,
                components={"format_ok": float(s.format_ok), "parsed": float(s.parsed is not None),
                            "answer_score": s.answer_score},
            ))
        return out

    def extract_answer(self, response: str) -> str | None:
        """The answer span the reward reads: the last ``<answer>...</answer>`` content, stripped
        (:func:`~arlopti.tasks.kk.reward.extract_last_answer`), for eval's per-item records."""
        return extract_last_answer(response)


__all__ = [
    "CORRECT_TOTAL", "CotStep", "KKScore", "KKTask", "MAX_PEOPLE", "MIN_PEOPLE", "OFFICIAL", "OFFICIAL_SEED",
    "PromptPieces", "Puzzle", "SYSTEM_PROMPT", "TEMPLATES", "build_prompt", "build_puzzle",
    "cot_steps", "cot_trace", "count_solutions", "evaluate", "extract_last_answer", "format_ok",
    "format_statements", "official_prompt", "parse_answer", "parse_gold", "parse_statements",
    "sample_logical_puzzles", "sample_puzzles", "score_response", "score_response_detailed", "scored_text",
    "sft_response", "solve",
    "validate_statements",
]
