"""Multi-turn training learns: the tiny model on the toy environment (arlopti/tasks/env/toy.py).

Each episode has up to 3 model turns of at most 8 new tokens, a turn ending at its first space
(``rollout.stop=[" "]``); the environment answers the first two with "then " (plain text continuing the
message, trainable 0) and rewards each with the share of a-m letters in its first 8 characters; the
third turn is the final answer, scored the same way by the task below. A turn that reaches 8 tokens
without a space ends its episode there (and the task scores that turn). The episode reward is the
task's reward plus the environment's, in [0, 3]. The same settings as tests/learner/test_learning.py
otherwise: 4 prompts x 4 samples per step, T = 1, two mini-batches, lr 1e-2, fixed seeds, 30 steps.

The test: the mean reward of the last 3 steps exceeds that of the first 3 by ``MARGIN`` = 0.5.

Why 0.5 is safely above the noise: the control (lr 1e-9, same seeds, nothing learns) measures it. Its 30
per-step mean rewards have a standard deviation ``sd`` of 0.079, so the difference of two 3-step means has
a standard deviation of 0.079 * sqrt(2/3) = 0.065: 0.5 is about 7.8 of them. Its own 3-vs-3 gain was
-0.010. The control asserts that the difference's standard deviation stays under ``MARGIN / 4`` and its
own gain under ``MARGIN / 3``. The learning run went from 0.635 to 1.971 (gain 1.34, 2.7 times the
margin), its episodes running 2.7 turns on average at both ends. Measured with
``pytest tests/learner/test_multiturn_learning.py -s`` (which prints all of these), on CPU, about 9 s a run.
While the outcome reward sat at position ``sum(mask) - 1`` of an episode (an environment token as often as
not, which zeroed its advantage; arlopti.algorithms.advantages.outcome_token_rewards now puts it on the
last sampled token), the same run gained only 0.33: under the margin.
"""

from __future__ import annotations

import pytest
import statistics

import lightning.pytorch as L
from helpers.toy import ToyDataModule

from arlopti.callbacks.rollout import RolloutCallback
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.config.schema import EnvConfig
from arlopti.learner.module import GRPOModule
from arlopti.prompts.records import PromptRecord
from arlopti.tasks.base import _TASKS, RewardResult, Task, register_task
from arlopti.tasks.env.toy import letter_share

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

STEPS = 30
MARGIN = 0.5  # about 7.8 standard deviations of the control's 3-vs-3 difference (module docstring)


class LetterShareTask(Task):
    """The final turn's reward: :func:`arlopti.tasks.env.toy.letter_share` of its text."""

    name = "letter_share"

    def score(self, responses, ground_truths, metas):
        return [RewardResult(letter_share(t), letter_share(t) > 0.5) for t in responses]


if "letter_share" not in _TASKS:
    register_task("letter_share")(LetterShareTask)


class LetterShareData(ToyDataModule):
    task_name = "letter_share"

    def train_records(self):
        return [PromptRecord(uid=f"letter_share/{i}", ground_truth=None, task="letter_share", text=f"Zoey said {i}.")
                for i in range(self.n)]


class Log(L.Callback):
    def __init__(self):
        self.rewards: list[float] = []
        self.turns: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = pl_module.last_step_context.metrics
        self.rewards.append(metrics["reward/mean"])
        metas = batch.experience.episode_metas
        self.turns.append(statistics.fmean(m["turns"] for m in metas))


def _train(tok, lr: float) -> Log:
    L.seed_everything(0, verbose=False)
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.0),
                    sizes=SizesConfig(prompts_per_step=4, group_size=4, mini_batch_size=8, micro_batch_size=8,
                                      logprob_micro_batch_size=16),
                    optim=OptimConfig(lr=lr),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=8, seed=1, stop=[" "], max_turns=3,
                                          max_episode_tokens=40, return_logprobs=False))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=STEPS)
    data = LetterShareData(n=256, tokenizer=tok, prompts_per_step=4, max_prompt_length=256, seed=3)
    log = Log()
    env = EnvConfig(env="arlopti.tasks.env.toy:ToyWordsEnv")
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=100, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=4, env=env), log])
    trainer.fit(module, datamodule=data)
    assert module.rollout_step == STEPS
    return log


def _gain(values: list[float]) -> float:
    return statistics.fmean(values[-3:]) - statistics.fmean(values[:3])


def test_multiturn_training_learns(tiny_tokenizer):
    log = _train(tiny_tokenizer, lr=1e-2)
    print(f"multi-turn: reward {statistics.fmean(log.rewards[:3]):.3f} -> {statistics.fmean(log.rewards[-3:]):.3f}, "
          f"turns {statistics.fmean(log.turns[:3]):.2f} -> {statistics.fmean(log.turns[-3:]):.2f}")
    assert max(log.turns) > 1  # episodes do have several turns
    assert _gain(log.rewards) > MARGIN, f"no learning: {log.rewards[:3]} ... {log.rewards[-3:]}"


def test_control_without_learning_stays_within_the_noise(tiny_tokenizer):
    log = _train(tiny_tokenizer, lr=1e-9)
    sd = statistics.stdev(log.rewards)
    print(f"control (lr 1e-9): per-step sd {sd:.4f}, gain {_gain(log.rewards):+.4f}, sd of a 3-vs-3 difference "
          f"{sd * (2 / 3) ** 0.5:.4f}, turns {statistics.fmean(log.turns):.2f}")
    assert abs(_gain(log.rewards)) < MARGIN / 3
    assert sd * (2 / 3) ** 0.5 < MARGIN / 4
