"""Issue 52 row 4: an environment that stops the run (``EnvError``) in DAPO's extra sampling rounds or in validation
saves ``last.ckpt`` first and says where, as one that stops it in the step's first round does (issue 42)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from arlopti.callbacks.benchmark_eval import BenchmarkEvalCallback
from arlopti.callbacks.rollout import Group, RolloutCallback
from arlopti.prompts.batch import PromptSample
from arlopti.tasks.base import RewardResult
from arlopti.tasks.env import EnvError

pytestmark = pytest.mark.timeout(60)

BROKEN = "the environment Broken: step failed on 4 of its 4 calls"


class Checkpoints:
    """The checkpoint callback's saving side (``save_last_checkpoint``), recording each save."""

    dirpath = Path("/run/checkpoints")

    def __init__(self):
        self.saved: list[tuple[int, str]] = []

    def save_last_checkpoint(self, trainer, step: int, reason: str) -> Path:
        self.saved.append((step, reason))
        return self.dirpath / "last.ckpt"


class ExtraBatches:
    """A prompt datamodule's ``extra_batch`` (DAPO's extra rounds draw from it)."""

    def extra_batch(self, position, k):
        return SimpleNamespace(position=position, round=k)


def trainer_and_module(step: int, datamodule=None):
    ckpt = Checkpoints()
    trainer = SimpleNamespace(callbacks=[ckpt], world_size=1, global_rank=0, datamodule=datamodule, optimizers=[],
                              callback_metrics={}, loggers=[])
    cfg = SimpleNamespace(rollout=SimpleNamespace(placement="colocated"),
                          algorithm=SimpleNamespace(dapo=SimpleNamespace(dynamic_sampling=True, max_gen_batches=4)))
    return trainer, SimpleNamespace(cfg=cfg, rollout_step=step), ckpt


def test_an_env_error_in_an_extra_dapo_round_saves_the_checkpoint_first():
    trainer, module, ckpt = trainer_and_module(step=3, datamodule=ExtraBatches())
    cb = RolloutCallback(group_size=2)
    no_signal = [Group([1], "p", {}, [], [RewardResult(1.0, True, {}), RewardResult(1.0, True, {})])]

    def collect(pl_module, prompts, timings, round_index=0, ahead=None):
        if round_index >= 1:  # round 0 carried no signal: the environment fails in the extra round
            raise EnvError(BROKEN)
        return SimpleNamespace(groups=[[]])

    cb.collect = collect
    cb.score = lambda prompts, episodes, pl_module, timings: no_signal
    with pytest.raises(EnvError) as err:
        cb.on_train_batch_start(trainer, module, SimpleNamespace(position=0), 0)
    line = str(err.value)
    assert ckpt.saved == [(3, "the environment failed")]
    assert line.startswith(BROKEN) and "\n" not in line
    assert ("The 3 rollout step(s) done are saved in /run/checkpoints/last.ckpt: resume with the same command plus "
            "ckpt_path=last once the environment is fixed.") in line


class Engine:
    def wake(self):
        pass

    def sync_weights(self, policy, version):
        pass

    def sleep(self):
        pass


@pytest.mark.parametrize("step, saved", [(2, [(2, "the environment failed")]), (0, [])])
def test_an_env_error_in_validation_saves_the_checkpoint_first(monkeypatch, step, saved):
    def failing(*args, **kwargs):
        raise EnvError(BROKEN)

    monkeypatch.setattr("arlopti.callbacks.benchmark_eval.evaluate_sets", failing)
    dm = SimpleNamespace(val_sets={"s": [PromptSample([1], "p", "a", "t", "u")]})
    trainer, module, ckpt = trainer_and_module(step=step, datamodule=dm)
    module.rollout_engine, module.policy, module.weight_version, module.rollout_turns = Engine(), None, 0, None
    with pytest.raises(EnvError) as err:
        BenchmarkEvalCallback().run(trainer, module)
    line = str(err.value)
    assert ckpt.saved == saved and line.startswith(BROKEN) and "\n" not in line
    if step:
        assert "The 2 rollout step(s) done are saved in /run/checkpoints/last.ckpt" in line
    else:
        assert line.endswith("No rollout step was done: no checkpoint is written.")
