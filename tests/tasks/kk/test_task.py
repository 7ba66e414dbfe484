"""KKTask: registration and scoring through the Task interface."""

from __future__ import annotations

from arlopti.tasks.base import get_task
from arlopti.tasks.kk import KKTask

GOLD = "(1) Ann is a knight\n(2) Bob is a knave"


def test_registered_and_scores():
    task = get_task("kk")
    assert isinstance(task, KKTask) and task.name == "kk"
    responses = [
        " x </think><answer> (1) Ann is a knight\n(2) Bob is a knave </answer>",
        " x </think><answer> Ann is a knave, Bob is a knave </answer>",
        " x </think><answer> no idea </answer>",
        "<think> x </think><answer> Ann is a knight, Bob is a knave </answer>",
    ]
    results = task.score(responses, [GOLD] * 4, [{"n_people": 2}] * 4)
    assert [r.reward for r in results] == [3.0, -0.5, -1.0, -3.0]
    assert [r.correct for r in results] == [True, False, False, False]
    assert [r.components["format_ok"] for r in results] == [1.0, 1.0, 1.0, 0.0]
    assert [r.components["parsed"] for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert [r.components["answer_score"] for r in results] == [2.0, -1.5, -2.0, -2.0]


def test_verl_style_ground_truth_dict():
    r = KKTask().score([" </think><answer>Ann is a knight, Bob is a knave</answer>"],
                       [{"solution_text_format": GOLD, "statements": "()"}], [{}])
    assert r[0].reward == 3.0


def test_official_cut_option():
    import pytest

    from arlopti.config import ConfigError
    from arlopti.tasks.base import check_task_options

    cut = " x Assistant: y </think><answer>Ann is a knight, Bob is a knave</answer>"
    fresh = " x Assistant: <think> y </think><answer>Ann is a knight, Bob is a knave</answer>"
    assert KKTask().official_cut is False
    assert [r.reward for r in KKTask().score([cut, fresh], [GOLD] * 2, [{}] * 2)] == [3.0, -3.0]
    official = get_task("kk", official_cut=True)  # as the config layer builds it (tasks.kk.official_cut)
    results = official.score([cut, fresh], [GOLD] * 2, [{}] * 2)
    assert [r.reward for r in results] == [-3.0, 3.0]
    assert [r.components["format_ok"] for r in results] == [0.0, 1.0]
    check_task_options({"kk": {"official_cut": True}})
    with pytest.raises(ConfigError, match="official_cut"):
        check_task_options({"kk": {"official_cut": "yes"}})
    with pytest.raises(ConfigError, match="tasks.kk"):
        check_task_options({"kk": {"assistant_cut": True}})
