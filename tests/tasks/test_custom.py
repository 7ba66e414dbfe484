"""``task=custom``: a user's reward function in the killable worker pool (arlopti/tasks/custom.py).

A reward that raises and one that hangs score 0, are counted (components ``error`` / ``timeout``,
``CustomTask.stats``), the first traceback is logged once, and a training run finishes; bad input
is a ConfigError naming the spec and the import error, or the function and the returned type."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from arlopti.config import ConfigError
from arlopti.tasks.custom import CustomTask, _BadValue, parse_value

REWARDS = '''
import time


def score(response, ground_truth, meta):
    if response == "raise":
        raise RuntimeError("boom in user code")
    if response == "hang":
        time.sleep(60)
    if response == "dict":
        return {"reward": 0.5, "correct": True, "length": len(response)}
    return response == ground_truth


def text(response, ground_truth, meta):
    return "not a number"


def late_text(response, ground_truth, meta):
    return 1.0 if response == "ok" else None


def batched(responses, ground_truths, metas):
    return [float(r == g) for r, g in zip(responses, ground_truths)]


def batched_short(responses, ground_truths, metas):
    return [1.0]


_calls = 0


def flaky(response, ground_truth, meta):
    """Per worker process: odd calls raise, even calls hang (the killed worker's successor starts over)."""
    global _calls
    _calls += 1
    if _calls % 2:
        raise ValueError("flaky reward")
    time.sleep(60)
'''


@pytest.fixture()
def rewards(tmp_path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def test_parse_value_rules():
    r = parse_value(1.0, 0.0)
    assert (r.reward, r.correct, r.components) == (1.0, True, {})
    assert parse_value(0, 0.0).correct is False
    assert (parse_value(True, 0.0).reward, parse_value(False, 0.0).reward) == (1.0, 0.0)
    r = parse_value({"reward": 0.5, "correct": False, "n": 2}, 0.0)
    assert (r.reward, r.correct, r.components) == (0.5, False, {"n": 2.0})
    assert parse_value({"reward": -1.0}, 0.0).correct is False  # -1 > 0 is false
    assert parse_value(0.5, 0.5).correct is False and parse_value(0.6, 0.5).correct is True
    for bad in (("__arlopti_bad_type__", "str", "'x'"), {"score": 1.0}):
        with pytest.raises(_BadValue):
            parse_value(bad, 0.0)
    for bad in ({"reward": 1.0, "mean": 1.0}, {"reward": 1.0, "a/b": 1.0}, math.nan, math.inf):
        with pytest.raises(ValueError):
            parse_value(bad, 0.0)


@pytest.mark.process


def test_raise_and_hang_score_zero_and_are_counted(rewards, caplog):
    task = CustomTask(reward_fn=f"{rewards}:score", timeout_s=0.5, batch_budget_s=None, num_workers=2)
    try:
        with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
            out = task.score(["5", "raise", "hang", "dict", "4"], ["5"] * 5, [{}] * 5)
            again = task.score(["raise"], ["5"], [{}])
    finally:
        task.close()
    assert [r.reward for r in out] == [1.0, 0.0, 0.0, 0.5, 0.0]
    assert [r.correct for r in out] == [True, False, False, True, False]
    assert [r.components["error"] for r in out] == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert [r.components["timeout"] for r in out] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert [r.components["length"] for r in out] == [0.0, 0.0, 0.0, 4.0, 0.0]  # absent -> 0
    assert again[0].reward == 0.0 and again[0].components["error"] == 1.0
    assert (task.stats["responses"], task.stats["error"], task.stats["timeout"]) == (6, 2, 1)
    text = caplog.text
    assert text.count("first error") == 1 and "RuntimeError: boom in user code" in text
    assert 'rewards.py", line' in text  # the user's frame is in the traceback
    assert task._pool is None


@pytest.mark.process


def test_batch_budget_stops_hanging_calls(rewards):
    task = CustomTask(reward_fn=f"{rewards}:score", timeout_s=30, batch_budget_s=0.5, num_workers=1,
                      max_error_frac=None)
    try:
        out = task.score(["hang", "hang", "5"], ["5"] * 3, [{}] * 3)
    finally:
        task.close()
    assert [r.reward for r in out] == [0.0, 0.0, 0.0]  # the budget ran out before the third was checked
    assert [r.components["timeout"] for r in out] == [1.0, 1.0, 1.0]


@pytest.mark.process


def test_batch_function(rewards):
    task = CustomTask(reward_fn=f"{rewards}:batched", batch=True, num_workers=2)
    try:
        out = task.score(["1", "2", "3"], ["1", "0", "3"], [{}] * 3)
    finally:
        task.close()
    assert [r.reward for r in out] == [1.0, 0.0, 1.0]
    short = CustomTask(reward_fn=f"{rewards}:batched_short", batch=True, num_workers=1)
    try:
        with pytest.raises(ConfigError, match="list of 1 values for 2 responses"):
            short.score(["1", "2"], ["1", "2"], [{}, {}])
    finally:
        short.close()


@pytest.mark.process


def test_import_path_spec_uses_the_current_directory(tmp_path, monkeypatch):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text("def score(response, ground_truth, meta):\n    return len(response)\n")
    monkeypatch.chdir(tmp_path)
    task = CustomTask(reward_fn="my_pkg.rewards:score", num_workers=1)
    try:
        assert [r.reward for r in task.score(["abc"], [None], [{}])] == [3.0]
    finally:
        task.close()


@pytest.mark.parametrize("spec,words", [
    ("no_such_pkg_xyz.rewards:score", ["no_such_pkg_xyz.rewards", "ModuleNotFoundError", "No module named"]),
    ("missing_dir/rewards.py:score", ["missing_dir/rewards.py", "does not exist"]),
    ("SYNTAX:score", ["broken.py", "SyntaxError", "broken.py:2"]),
    ("REWARDS:nope", ["has no attribute 'nope'", "'score'"]),
    ("rewards_without_colon", ["expected 'module.path:function'"]),
])
def test_bad_reward_path_is_a_config_error_naming_path_and_cause(spec, words, rewards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("def score(r, g, m):\n    return (\n")
    spec = spec.replace("SYNTAX", str(tmp_path / "broken.py")).replace("REWARDS", str(rewards))
    with pytest.raises(ConfigError) as err:
        CustomTask(reward_fn=spec)
    assert str(err.value).startswith("task.reward_fn")
    for w in words:
        assert w in str(err.value)


@pytest.mark.process


def test_non_number_is_a_config_error_naming_function_and_type(rewards):
    task = CustomTask(reward_fn=f"{rewards}:text", num_workers=1)
    try:
        with pytest.raises(ConfigError, match=r"rewards\.py:text returned a str \('not a number'\)"):
            task.score(["x"], ["y"], [{}])
    finally:
        task.close()


@pytest.mark.process


def test_wrong_type_after_valid_values_is_counted_not_fatal(rewards):
    task = CustomTask(reward_fn=f"{rewards}:late_text", num_workers=1)
    try:
        assert task.score(["ok"], [None], [{}])[0].reward == 1.0
        out = task.score(["other"], [None], [{}])
    finally:
        task.close()
    assert out[0].reward == 0.0 and out[0].components["error"] == 1.0 and task.stats["bad_type"] == 1


@pytest.mark.process


def test_worker_load_error_carries_the_workers_message():
    from arlopti.tasks.math.pool import WorkerLoadError, WorkerPool

    pool = WorkerPool(1, preload_symbolic=False, user_functions={"user.f": "no_such_module_qq:f"})
    try:
        with pytest.raises(WorkerLoadError, match="no_such_module_qq"):
            pool.run([("user.f", ())], 5.0)
    finally:
        pool.close()


def test_options_are_checked():
    for kwargs, key in (({}, "task.reward_fn is not set"), ({"reward_fn": "a:b", "timeout_s": 0}, "task.timeout_s"),
                        ({"reward_fn": "a:b", "batch": "yes"}, "task.batch"),
                        ({"reward_fn": "a:b", "num_workers": 0}, "task.num_workers")):
        with pytest.raises(ConfigError, match=key):
            CustomTask(**kwargs)


# ---- through train.py's build / train ------------------------------------------------------------

def _prompts(tmp_path: Path, n: int = 4) -> Path:
    import json

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(n)))
    return path


def test_start_up_errors_name_the_reward_path_and_the_missing_task(tmp_path):
    from helpers.compose import compose_train

    from arlopti.entry.train import build

    data = ["data=prompts", f"data.train_file={_prompts(tmp_path)}", "debug=smoke", "logger=none"]
    cfg = compose_train([*data, "task=custom", "task.reward_fn=no_such_pkg_xyz.rewards:score"], tmp_path)
    with pytest.raises(ConfigError, match=r"no_such_pkg_xyz\.rewards.*ModuleNotFoundError"):
        build(cfg)
    cfg = compose_train(data, tmp_path)  # data=prompts scores with task=custom, which is not configured
    with pytest.raises(ConfigError, match="task.reward_fn is not set"):
        build(cfg)


@pytest.mark.process


def test_training_run_finishes_with_a_reward_that_raises_and_hangs(rewards, tmp_path, caplog):
    from helpers.compose import compose_train

    from arlopti.entry.train import train

    cfg = compose_train(["data=prompts", f"data.train_file={_prompts(tmp_path)}", "task=custom",
                         f"task.reward_fn={rewards}:flaky", "task.timeout_s=0.3", "task.num_workers=1",
                         "task.max_error_frac=1.0",
                         "debug=smoke", "logger=none", "rollout.max_new_tokens=4"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
        module = train(cfg)["module"]
    assert module.rollout_step == 2
    metrics = module.last_step_context.metrics
    # one worker alternates raise, hang (killed; its successor starts over): half errors, half timeouts
    assert float(metrics["reward/error"]) == pytest.approx(0.5)
    assert float(metrics["reward/timeout"]) == pytest.approx(0.5)
    assert float(metrics["reward/mean"]) == 0.0
    assert caplog.text.count("first error") == 1 and "ValueError: flaky reward" in caplog.text


# ---- several weighted functions, the stop rule ---------------------------------------------------

SEVERAL = '''
def exact(response, ground_truth, meta):
    return {"reward": float(response == ground_truth), "correct": response == ground_truth, "hits": 1.0}


def length(response, ground_truth, meta):
    if response == "raise":
        raise TypeError("length cannot score this")
    return -len(response)


def always_fails(response, ground_truth, meta):
    raise TypeError("unsupported operand")
'''


@pytest.fixture()
def several(tmp_path) -> Path:
    path = tmp_path / "several.py"
    path.write_text(SEVERAL)
    return path


@pytest.mark.process


def test_several_functions_weighted_sum_components_and_errors(several):
    task = CustomTask(reward_fns=[f"{several}:exact", f"{several}:length"], reward_weights=[2.0, 0.5],
                      num_workers=1, max_error_frac=None)
    try:
        out = task.score(["5", "44", "raise"], ["5", "4", "raise"], [{}] * 3)
    finally:
        task.close()
    assert [r.reward for r in out] == [2.0 - 0.5, -1.0, 2.0]  # the erroring component counts 0
    assert [r.components["exact"] for r in out] == [1.0, 0.0, 1.0]
    assert [r.components["length"] for r in out] == [-1.0, -2.0, 0.0]
    assert [r.components["exact.hits"] for r in out] == [1.0, 1.0, 1.0]
    assert [r.components["error"] for r in out] == [0.0, 0.0, 1.0]
    assert [r.correct for r in out] == [True, False, True]  # from exact's own "correct"
    assert (task.stats["error:length"], task.stats["error:exact"], task.stats["error"]) == (1, 0, 1)


@pytest.mark.process


def test_builtin_math_reward_combines_with_a_users(several):
    task = CustomTask(reward_fns=["arlopti.tasks.builtin_rewards:math", f"{several}:length"],
                      reward_weights=[1.0, 0.01], num_workers=1)
    try:
        out = task.score(["so \\boxed{42}", "\\boxed{41}"], ["42", "42"], [{}, {}])
    finally:
        task.close()
    assert [r.components["math"] for r in out] == [1.0, 0.0]
    assert [r.correct for r in out] == [True, False]
    assert out[0].reward == pytest.approx(1.0 - 0.01 * len("so \\boxed{42}"))


def test_weights_and_lists_are_checked(several):
    for kwargs, words in (({"reward_fns": [f"{several}:exact"], "reward_weights": [1.0, 2.0]}, "task.reward_weights"),
                          ({"reward_fns": f"{several}:exact"}, "expected a list"),
                          ({"reward_fn": f"{several}:exact", "reward_fns": [f"{several}:exact"]}, "give one"),
                          ({"reward_fns": [f"{several}:exact", "nope_qq.mod:f"]}, r"task.reward_fns\[1\]"),
                          ({"reward_fn": f"{several}:exact", "max_error_frac": 2}, "task.max_error_frac")):
        with pytest.raises(ConfigError, match=words):
            CustomTask(**kwargs)


@pytest.mark.process


def test_a_function_that_always_fails_stops_naming_it_the_setting_and_the_traceback(several, caplog):
    from arlopti.tasks.custom import RewardFailureError

    task = CustomTask(reward_fns=[f"{several}:exact", f"{several}:always_fails"], num_workers=1)
    try:
        with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
            with pytest.raises(RewardFailureError) as err:
                task.score(["1", "2"], ["1", "2"], [{}, {}])
    finally:
        task.close()
    text = str(err.value)
    assert "always_fails failed on 2 of 2 responses" in text and "task.max_error_frac=0.5" in text
    assert "\n" not in text and "First error (its traceback is logged above): TypeError: unsupported operand" in text
    assert caplog.text.count('several.py", line') == 1  # the traceback is shown once: in the log, before the error


@pytest.mark.process


def test_failures_below_the_limit_over_the_window_do_not_stop(several):
    task = CustomTask(reward_fn=f"{several}:length", num_workers=1, max_error_frac=0.5, error_window=2)
    try:
        task.score(["a", "b", "c"], [None] * 3, [{}] * 3)
        task.score(["raise", "b"], [None] * 2, [{}] * 2)  # 1 of 5 over the window
        task.score(["raise", "b"], [None] * 2, [{}] * 2)  # 2 of 4: not above 0.5
    finally:
        task.close()
    assert task.stats["error"] == 2


@pytest.mark.slow
def test_cli_run_with_an_always_failing_reward_exits_non_zero_naming_it(several, tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT

    proc = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), "task=custom",
                           f"task.reward_fn={several}:always_fails", "data=prompts",
                           f"data.train_file={_prompts(tmp_path)}", "debug=smoke", "logger=csv",
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert f"RewardFailureError: the reward function {several}:always_fails failed on 8 of 8 responses" in out
    assert "task.max_error_frac=0.5" in out
    assert out.count("Traceback (most recent call last)") == 1  # the user's traceback, once
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
