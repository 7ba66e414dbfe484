"""The built-in rewards as plain reward functions, to combine with your own in ``task.reward_fns``.

Each has the custom task's signature ``fn(response, ground_truth, meta) -> dict`` (:mod:`arlopti.tasks.custom`)
and returns the same reward as the built-in task, with ``correct`` set as that task sets it::

    task=custom task.reward_fns=[arlopti.tasks.builtin_rewards:math,my_rewards.py:length_penalty] \
        task.reward_weights=[1.0,0.1]

* :func:`kk`: the Logic-RL K&K reward of ``task kk`` (:func:`arlopti.tasks.kk.reward.score_response_detailed`,
  ``official_cut=False``), in {3, -0.5, -1, -3}; the ground truth is the ``solution_text_format``
  string or a mapping holding it (the verl layout).
* :func:`math`: the math reward of ``task math`` with the official grader
  (:func:`arlopti.tasks.math.grader.score_response_detailed`), 1 for a matching last boxed answer
  else 0; the ground truth is a string, a number or a list of those.

They run in the custom task's worker pool like any function given by name (the math grader starts
its own symbolic-check worker inside it, with its 3 s timeout).
"""

from __future__ import annotations

from typing import Any


def kk(response: str, ground_truth: Any, meta: dict) -> dict:
    from arlopti.tasks.kk.reward import score_response_detailed

    gold = ground_truth.get("solution_text_format", "") if isinstance(ground_truth, dict) else ground_truth
    s = score_response_detailed(response, gold, False)
    return {"reward": float(s.total), "correct": bool(s.correct)}


def math(response: str, ground_truth: Any, meta: dict) -> dict:
    from arlopti.tasks.math.grader import score_response_detailed

    d = score_response_detailed(response, ground_truth)
    return {"reward": float(d.reward), "correct": d.reward == 1.0}
