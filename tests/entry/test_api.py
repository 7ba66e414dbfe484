"""arlopti.run's keywords become the command line's overrides (arlopti/entry/api.py); a failure raises the
run's own exception without Hydra's report; Ctrl-C saves the checkpoint and raises. The full run is
tested by tests/test_python_api_guide.py (docs/python_api.md)."""

from __future__ import annotations

import json
import signal

import pytest

import arlopti
from arlopti.entry.api import build_overrides, data_file
from arlopti.config import ConfigError


def score(response, ground_truth, meta):
    return 0.0


def test_keywords_become_overrides(tmp_path):
    assert build_overrides() == []
    out = build_overrides(["debug=smoke"], reward_fn="my.mod:fn")
    assert out == ["debug=smoke", "task=custom", "task.reward_fn='my.mod:fn'"]
    out = build_overrides(["task=custom"], reward_fn=[score, "r.py:g"], reward_weights=[1, 0.5])
    assert out[0] == "task=custom" and out.count("task=custom") == 1
    assert out[1].startswith("task.reward_fns=['callable:score_") and out[1].endswith(",'r.py:g']")
    assert out[2] == "task.reward_weights=[1.0,0.5]"
    rows = [{"prompt": "p", "answer": "1"}]
    out = build_overrides(train_data=rows)
    assert out[0] == "data=prompts" and out[1] == f"data.train_file='{data_file(rows)}'"
    assert json.loads(open(data_file(rows)).read()) == rows[0] and data_file(list(rows)) == data_file(rows)
    assert build_overrides(["data=verl_parquet"], train_data=str(tmp_path))[1] == f"data.train_file='{tmp_path}'"
    with pytest.raises(TypeError, match="train_data"):
        data_file(42)


def test_bad_override_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="algorithm.lopti.enabled"):
        arlopti.run(["algorithm.lopti.enabled=no"])


@pytest.mark.process


def test_import_arlopti_keeps_the_api_light():
    import subprocess
    import sys

    code = "import sys, arlopti; print(arlopti.run.__module__, 'torch' in sys.modules, 'lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "arlopti.entry.api" and out[1:] == ["False", "False"]


def test_reward_weights_without_reward_functions_is_a_clear_error():
    """Used to reach Hydra as task.reward_weights=[...] with no task=custom: a bare ConfigCompositionException."""
    with pytest.raises(ConfigError, match=r"reward_weights=\[1.0, 0.5\] weighs the reward functions of task=custom, "
                                          r"and none is given: pass reward_fn=\[...\]"):
        arlopti.run(["debug=smoke"], reward_weights=[1.0, 0.5], train_data=[{"prompt": "p", "answer": "1"}])
    with pytest.raises(ConfigError, match="has 1 weights for 2 reward function"):
        build_overrides(reward_fn=["a.py:f", "a.py:g"], reward_weights=[1.0])
    # with the functions named in the overrides, the weights alone are fine
    assert build_overrides(["task=custom", "task.reward_fns=[a.py:f,a.py:g]"], reward_weights=[1, 2])[-1] == \
        "task.reward_weights=[1.0,2.0]"


SMOKE = ["debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
         "~callbacks.benchmark_eval", "~callbacks.rich_progress_bar", "logger=none"]


def test_a_failing_run_raises_its_own_error_and_hydra_prints_nothing(tmp_path, capfd):
    with pytest.raises(ConfigError, match=r"optim.lr=1e\+38 is too large"):
        arlopti.run([*SMOKE, f"paths.log_dir={tmp_path}", "optim.lr=1e38"])
    err = capfd.readouterr().err
    assert "Error executing job" not in err and "Traceback" not in err
    (log,) = tmp_path.rglob("train.log")  # the traceback is in the run's log
    assert "Traceback (most recent call last)" in log.read_text()


def test_ctrl_c_saves_the_checkpoint_then_raises_keyboard_interrupt(tmp_path):
    """SIGINT at the start of step 1 of 2: the step finishes, last.ckpt is written, and a loop of runs
    stops (RunInterrupted is a KeyboardInterrupt) with the result, the checkpoint and the objective."""
    from arlopti.entry.api import RunInterrupted

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        arlopti.run([*SMOKE, f"paths.log_dir={tmp_path}", "optimized_metric=reward/mean",
                     "+callbacks.ctrl_c={_target_: helpers.signals.SendSignal, at_step: 1}"])
    assert isinstance(caught.value, RunInterrupted)
    result = caught.value.result
    assert result.interrupted == "SIGINT" and result.summary["rollout_steps"] == 1
    assert result.checkpoint == result.run_dir / "checkpoints" / "last.ckpt" and result.checkpoint.is_file()
    assert f"checkpoint {result.checkpoint}" in str(caught.value)
    assert result.objective == result.metrics["reward/mean"]
    assert signal.getsignal(signal.SIGINT) == before
