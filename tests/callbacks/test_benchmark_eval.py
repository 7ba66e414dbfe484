"""BenchmarkEvalCallback: its modes, its schedule, and one evaluation through a scripted engine
into the loggers, ``trainer.callback_metrics`` and ``pl_module.eval_results``. The metrics
themselves are tested in tests/eval/test_runner.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from arlopti.callbacks.benchmark_eval import BenchmarkEvalCallback, parse_modes
from arlopti.prompts.batch import PromptSample
from arlopti.eval.runner import KK_MODES, MATH_MODES, EvalMode
from arlopti.rollout.engine import Completion, RolloutEngine
from arlopti.tasks.base import RewardResult, Task


def test_modes_default_to_the_official_protocols():
    assert parse_modes(None) == {"kk": KK_MODES, "math": MATH_MODES}
    modes = parse_modes({"kk": [{"name": "greedy", "temperature": 0.0, "n": 1}]})
    assert modes["kk"] == (EvalMode("greedy", 0.0, 1.0, -1, 1),) and modes["math"] == MATH_MODES


class Counting(BenchmarkEvalCallback):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.steps = []

    def run(self, trainer, pl_module):
        self.steps.append(pl_module.rollout_step)
        return {}


def test_schedule_before_every_n_and_at_the_end_but_not_after_preemption():
    cb = Counting(every_n_steps=2)
    module = SimpleNamespace(rollout_step=0, preempted=False)
    cb.on_train_start(None, module)
    for step in (1, 2, 3, 4):
        module.rollout_step = step
        cb.on_train_batch_end(None, module, None, None, step - 1)
    cb.on_train_end(None, module)
    assert cb.steps == [0, 2, 4, 4]  # run() itself skips a step it has evaluated
    module.preempted = True
    cb.on_train_end(None, module)
    assert cb.steps == [0, 2, 4, 4]
    quiet = Counting(every_n_steps=None, before_training=False, at_end=False)
    quiet.on_train_start(None, SimpleNamespace(rollout_step=0))
    quiet.on_train_batch_end(None, SimpleNamespace(rollout_step=20), None, None, 0)
    assert quiet.steps == []


class Echo(RolloutEngine):
    def generate(self, prompt_ids, n, sampling):
        return [[Completion([1], "a" if p[0] % 2 == 0 else "b", "stop") for _ in range(n)] for p in prompt_ids]


class Exact(Task):
    def score(self, responses, gts, metas):
        return [RewardResult(float(r == g), r == g, {}) for r, g in zip(responses, gts)]


class Logger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))


def test_one_evaluation_reaches_the_loggers_the_callback_metrics_and_the_summary(monkeypatch):
    import arlopti.callbacks.benchmark_eval as be

    monkeypatch.setattr(be, "get_task", lambda name, **kw: Exact())
    sets = {"s": [PromptSample([i], f"p{i}", "a", "t", f"u{i}") for i in range(4)]}
    logger = Logger()
    trainer = SimpleNamespace(datamodule=SimpleNamespace(val_sets=sets), world_size=1, global_rank=0,
                              loggers=[logger], callback_metrics={})
    module = SimpleNamespace(rollout_step=3, rollout_engine=Echo(), policy=None, weight_version=0)
    cb = BenchmarkEvalCallback(modes={"t": [{"name": "greedy"}]})
    metrics = cb.run(trainer, module)
    assert metrics["val/t/s/greedy/acc"] == pytest.approx(0.5) and metrics["val/t/mean/greedy/acc"] == 0.5
    assert float(trainer.callback_metrics["val/t/s/greedy/acc"]) == pytest.approx(0.5)
    assert logger.calls == [(3, metrics)]
    assert module.eval_results == [{"rollout_step": 3, **metrics}]
    assert cb.run(trainer, module) == {}  # the same step again: nothing
