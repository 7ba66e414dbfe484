"""Callable rewards (arlopti/tasks/in_process.py): which run in the worker pool, which in-process,
and the in-process runner's timeout / error / NaN accounting through ``CustomTask``."""

from __future__ import annotations

import functools
import math
import time

import pytest

from arlopti.tasks.custom import CustomTask
from arlopti.tasks.in_process import InProcessRunner, importable_spec, placement, register_callable


def test_importable_functions_go_to_the_pool_others_stay_in_process():
    from arlopti.tasks import builtin_rewards

    assert importable_spec(builtin_rewards.kk) == "arlopti.tasks.builtin_rewards:kk"
    assert placement(register_callable(builtin_rewards.kk)) == ("arlopti.tasks.builtin_rewards:kk", None)
    local = lambda r, g, m: 1.0  # noqa: E731
    partial = functools.partial(builtin_rewards.kk)
    for fn in (local, partial, test_importable_functions_go_to_the_pool_others_stay_in_process.__call__):
        assert importable_spec(fn) is None
    spec, fn = placement(register_callable(local))
    assert fn is local and spec.endswith("(in-process)")
    assert placement("my_pkg.mod:fn") == ("my_pkg.mod:fn", None)
    with pytest.raises(KeyError, match="no callable of that name"):
        placement("callable:never_registered")


def test_runner_times_out_and_reports_errors():
    def slow(x):
        time.sleep(5)

    def boom(x):
        raise ValueError("bad input")

    runner = InProcessRunner({"slow": slow, "boom": boom, "ok": lambda x: x})
    t0 = time.monotonic()
    out = runner.run([("slow", (1,)), ("boom", (1,)), ("ok", (2,))], timeout_s=0.2)
    assert time.monotonic() - t0 < 2
    assert [o.status for o in out] == ["timeout", "error", "ok"] and out[2].value == 2.0
    assert "ValueError: bad input" in out[1].error and "in boom" in out[1].error
    out = runner.run([("slow", (1,)), ("ok", (3,))], timeout_s=5, budget_s=0.2)
    assert [(o.status, o.error) for o in out] == [("timeout", "budget"), ("timeout", "budget")]


def test_in_process_callable_is_scored_with_the_same_accounting():
    def reward(response, ground_truth, meta):
        if response == "raise":
            raise RuntimeError("user bug")
        if response == "nan":
            return math.nan
        if response == "hang":
            time.sleep(3)
        return {"reward": float(response == ground_truth), "n": 1.0}

    task = CustomTask(reward_fn=register_callable(reward), timeout_s=0.3, max_error_frac=None)
    out = task.score(["5", "raise", "nan", "hang"], ["5"] * 4, [{}] * 4)
    assert [r.reward for r in out] == [1.0, 0.0, 0.0, 0.0]
    assert [r.components["error"] for r in out] == [0.0, 1.0, 1.0, 0.0]
    assert [r.components["timeout"] for r in out] == [0.0, 0.0, 0.0, 1.0]
    assert (task.stats["error"], task.stats["timeout"]) == (2, 1) and task._pool is None  # no worker started
