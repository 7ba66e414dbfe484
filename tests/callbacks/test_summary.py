"""TrainingSummary: start/end windows and the validation columns (no training needed)."""

from types import SimpleNamespace

from arlopti.callbacks.summary import TrainingSummary


def _module(evals):
    return SimpleNamespace(rollout_step=4, _trainer=None, eval_results=evals)


def _history(cb, rewards):
    cb.history = [{"reward/mean": r, "reward/format_ok": r / 10} for r in rewards]


def test_windows_average_the_first_and_last_steps():
    cb = TrainingSummary(window=2)
    _history(cb, [-3.0, -1.0, 0.0, 2.0])
    s = cb.summary(_module([]))
    assert s["start"]["reward/mean"] == -2.0 and s["end"]["reward/mean"] == 1.0
    assert s["rollout_steps"] == 4 and s["eval_first"] == {} and s["eval_last"] == {}


def test_a_single_evaluation_is_not_reported_as_the_start():
    cb = TrainingSummary()
    _history(cb, [0.0])
    only = {"rollout_step": 4, "val/kk/mean/greedy/acc": 0.5}
    s = cb.summary(_module([only]))
    assert s["eval_first"] == {} and s["eval_last"] == only
    before = {"rollout_step": 0, "val/kk/mean/greedy/acc": 0.1}
    s = cb.summary(_module([before, only]))
    assert s["eval_first"] == before and s["eval_last"] == only
