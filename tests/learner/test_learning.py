"""Every algorithm learns: each registered estimator x policy loss, and the paper's methods on top.

The toy task ("first half"): the reward of a response is the share of its first 16 characters that
are the letters a-m, in [0, 1]. The tiny random model (byte-level BPE over K&K sentences, 512
tokens) starts near 0.29: about half its tokens are raw bytes, the rest word pieces. Raising the
probability of word pieces rich in a-m letters raises the reward, which a few dozen updates at
lr 1e-2 do. Each run: 4 prompts x 4 samples per step, 8 new tokens at T = 1, two mini-batches, so
two AdamW steps per rollout step (the second one off-policy, where the losses differ: with a single
on-policy step every loss's gradient is -A), no KL unless the run is about KL, fixed seeds, 30
rollout steps (about 2 s; the whole file about 1 minute on 2 cores).

The test: the mean reward of the last 3 steps exceeds that of the first 3 by ``MARGIN`` = 0.15.

Why 0.15 is safely above the noise: a step's mean reward averages 16 responses. With the learning
rate at 1e-9 (the control run below, same seeds, nothing learns) the 30 per-step means have a
standard deviation of about 0.03 (measured: ``pytest tests/learner/test_learning.py -k control -s``
prints it), so the difference of two 3-step means has a standard deviation of about
0.03 * sqrt(2/3) = 0.025: 0.15 is six of them. The control asserts that its own difference stays
under a third of the margin. The learning runs end between 0.62 and 1.0 from about 0.3 (printed
with ``-s``). The rollout corrections learn exactly as GRPO does here: on the HF engine in fp32
the engine's and the trainer's log-probs agree, so every weight is 1 (their own effect is tested
on tensors in tests/plugins/test_mismatch.py).

The matrix: every estimator x every loss of the first release (plain), every later estimator with
``ppo_clip`` and every later loss with ``grpo`` (the full product would cost ~2 s a pair); then GRPO,
RLOO, REINFORCE++, GSPO, CISPO and DAPO (clip-higher, no KL, dynamic sampling, overlong shaping) each
with AR (alpha 0.3) + Lopti (eta 0.5); each rollout correction (on the HF engine's own log-probs); KL
folded into the reward; the token methods; the low-probability-token rivals (OTB, DPPO, SimKO, Lp-Reg)
with AR + Lopti, and ASPO with Archer's bounds (Archer2.0).
"""

from __future__ import annotations

import statistics

import lightning.pytorch as L
import pytest

from arlopti.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from arlopti.callbacks.rollout import RolloutCallback
from arlopti.config import (AlgorithmConfig, DapoConfig, LoptiConfig, OptimConfig, RolloutConfig,
                            RolloutCorrectionConfig, RunConfig, SizesConfig, TokenMethodConfig)
from arlopti.prompts.records import PromptRecord
from arlopti.learner.module import GRPOModule
from arlopti.tasks.base import _TASKS, RewardResult, Task, register_task
from helpers.toy import ToyDataModule

STEPS = 30
MARGIN = 0.15
#: The settings each policy loss needs (configs/algorithm/<loss>.yaml): the clip, no dual-clip, GSPO's aggregation.
LOSS_SETTINGS = {
    "ppo_clip": {},
    "gspo": dict(clip_low=3e-4, clip_high=4e-4, dual_clip=None, loss_agg="seq-mean-token-mean"),
    "cispo": dict(clip_low=1.0, clip_high=0.28, dual_clip=None),
    # configs/experiment/kk_<loss>.yaml
    "dppo_tv": dict(clip_low=0.15, clip_high=0.15),
    "dppo_kl": dict(clip_low=0.05, clip_high=0.05),
    "sapo": dict(dual_clip=None, loss_agg="seq-mean-token-mean"),
    "ce_gppo": dict(clip_high=0.2),
    "aspo": dict(clip_high=0.2, dual_clip=3.0),
    "simko": dict(clip_high=0.2, dual_clip=None),
}
#: the first release's estimators and losses, whose full product stays in the matrix
FIRST_ESTIMATORS = ("drgrpo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo")
FIRST_LOSSES = ("cispo", "gspo", "ppo_clip")
AR_LOPTI = dict(ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.5))


class FirstHalfTask(Task):
    """Reward: the share of the first 16 characters that are the letters a-m (module docstring)."""

    name = "first_half"

    def score(self, responses, ground_truths, metas):
        out = []
        for text in responses:
            value = sum("a" <= c <= "m" for c in text[:16]) / 16
            out.append(RewardResult(value, value > 0.5))
        return out


if "first_half" not in _TASKS:
    register_task("first_half")(FirstHalfTask)


class FirstHalfData(ToyDataModule):
    task_name = "first_half"

    def train_records(self):
        return [PromptRecord(uid=f"first_half/{i}", ground_truth=None, task="first_half", text=f"Zoey said {i}.")
                for i in range(self.n)]


class RewardLog(L.Callback):
    def __init__(self):
        self.rewards: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rewards.append(pl_module.last_step_context.metrics["reward/mean"])


def _algorithm(estimator: str, loss: str, **extra) -> AlgorithmConfig:
    kwargs = dict(advantage=estimator, policy_loss=loss, kl_coef=0.0, **LOSS_SETTINGS[loss])
    kwargs.update(extra)
    return AlgorithmConfig(**kwargs)


def _train(tok, algo: AlgorithmConfig, lr: float = 1e-2, return_logprobs: bool = False) -> list[float]:
    L.seed_everything(0, verbose=False)
    cfg = RunConfig(algorithm=algo,
                    sizes=SizesConfig(prompts_per_step=4, group_size=4, mini_batch_size=8, micro_batch_size=8,
                                      logprob_micro_batch_size=16),
                    optim=OptimConfig(lr=lr),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=8, seed=1, return_logprobs=return_logprobs))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=STEPS)
    data = FirstHalfData(n=256, tokenizer=tok, prompts_per_step=4, max_prompt_length=256, seed=3)
    log = RewardLog()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=100, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=4), log])
    trainer.fit(module, datamodule=data)
    assert module.rollout_step == STEPS
    return log.rewards


def _gain(rewards: list[float]) -> float:
    return statistics.fmean(rewards[-3:]) - statistics.fmean(rewards[:3])


def _assert_learns(name: str, rewards: list[float]) -> None:
    gain = _gain(rewards)
    print(f"{name}: first 3 steps {statistics.fmean(rewards[:3]):.3f} -> last 3 {statistics.fmean(rewards[-3:]):.3f}")
    assert gain > MARGIN, f"{name} did not learn: mean reward {rewards[:3]} ... {rewards[-3:]} (gain {gain:.3f})"


def _in_matrix(est: str, loss: str) -> bool:
    return (est in FIRST_ESTIMATORS and loss in FIRST_LOSSES) or loss == "ppo_clip" or est == "grpo"


CASES = [(f"{est}/{loss}", _algorithm(est, loss), False)
         for est in ADVANTAGE_ESTIMATORS.names() for loss in POLICY_LOSSES.names() if _in_matrix(est, loss)]
CASES += [
    ("grpo+ar+lopti", _algorithm("grpo", "ppo_clip", **AR_LOPTI), False),
    ("rloo+ar+lopti", _algorithm("rloo", "ppo_clip", **AR_LOPTI), False),
    ("reinforce_pp+ar+lopti", _algorithm("reinforce_pp", "ppo_clip", **AR_LOPTI), False),
    ("gspo+ar+lopti", _algorithm("grpo", "gspo", **AR_LOPTI), False),
    ("cispo+ar+lopti", _algorithm("grpo", "cispo", **AR_LOPTI), False),
    ("dapo+ar+lopti", _algorithm("grpo", "ppo_clip", clip_high=0.28, **AR_LOPTI,
                                 dapo=DapoConfig(dynamic_sampling=True, max_gen_batches=3, overlong_buffer=2)), False),
    *[(f"grpo+{mode}", _algorithm("grpo", "ppo_clip", rollout_correction=RolloutCorrectionConfig(mode=mode)), True)
      for mode in ("tis", "mis", "seq_tis")],
    ("reinforce_pp+kl_in_reward", _algorithm("reinforce_pp", "ppo_clip", kl_coef=0.01, kl_in="reward"), False),
]
#: Token methods (arlopti.plugins.token_methods) at their defaults, then composed with AR and Lopti where allowed.
CASES += [(f"grpo+{m}", _algorithm("grpo", "ppo_clip", token_method=TokenMethodConfig(name=m)), False)
          for m in ("clip_cov", "kl_cov", "top_entropy", "archer", "tr_grpo", "reverse")]
CASES += [
    ("archer+ar+lopti", _algorithm("grpo", "ppo_clip", **AR_LOPTI, token_method=TokenMethodConfig(name="archer")),
     False),
    ("kl_cov+ar+lopti", _algorithm("grpo", "ppo_clip", **AR_LOPTI, token_method=TokenMethodConfig(name="kl_cov")),
     False),
    ("tr_grpo+lopti", _algorithm("grpo", "ppo_clip", lopti=LoptiConfig(enabled=True, eta=0.5),
                                 token_method=TokenMethodConfig(name="tr_grpo")), False),
]
#: The rivals composed (issue 35); Lp-Reg's share is raised so that its k = floor(share * n) > 1 on 32-token batches
LP_REG = TokenMethodConfig(name="lp_reg", lp_reg_neg_share=0.2)
CASES += [
    ("otb+ar+lopti", _algorithm("otb", "ppo_clip", **AR_LOPTI), False),
    ("dppo_tv+ar+lopti", _algorithm("grpo", "dppo_tv", **AR_LOPTI), False),
    ("simko+ar+lopti", _algorithm("grpo", "simko", **AR_LOPTI), False),
    ("aspo+archer", _algorithm("grpo", "aspo", token_method=TokenMethodConfig(
        name="archer", archer_clip_high_entropy=0.4, archer_high_entropy_kl=1.0)), False),
    ("grpo+lp_reg", _algorithm("grpo", "ppo_clip", dual_clip=None, token_method=LP_REG), False),
    ("lp_reg+ar+lopti", _algorithm("grpo", "ppo_clip", dual_clip=None, **AR_LOPTI, token_method=LP_REG), False),
]


def test_every_estimator_and_loss_is_in_the_matrix():
    names = {case[0] for case in CASES}
    assert all(f"{e}/ppo_clip" in names for e in ADVANTAGE_ESTIMATORS.names())
    assert all(f"grpo/{p}" in names for p in POLICY_LOSSES.names())
    assert all(f"{e}/{p}" in names for e in FIRST_ESTIMATORS for p in FIRST_LOSSES)
    assert set(LOSS_SETTINGS) == set(POLICY_LOSSES.names())


@pytest.mark.parametrize("name,algo,logprobs", CASES, ids=[case[0] for case in CASES])
def test_it_learns(tiny_tokenizer, name, algo, logprobs):
    _assert_learns(name, _train(tiny_tokenizer, algo, return_logprobs=logprobs))


def test_control_without_learning_stays_within_the_noise(tiny_tokenizer):
    rewards = _train(tiny_tokenizer, _algorithm("grpo", "ppo_clip"), lr=1e-9)
    sd = statistics.stdev(rewards)
    print(f"control (lr 1e-9): per-step sd {sd:.4f}, gain {_gain(rewards):+.4f}, "
          f"sd of a 3-vs-3 difference {sd * (2 / 3) ** 0.5:.4f}")
    assert abs(_gain(rewards)) < MARGIN / 3
    assert sd * (2 / 3) ** 0.5 < MARGIN / 4
