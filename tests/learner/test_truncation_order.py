"""DAPO truncation masking (``algorithm.dapo.mask_truncated``) removes truncated responses from the
loss only: their rewards still enter their groups' advantages (issue 24, §1).

The reference is a restatement of TRL's order (``trl/trainer/grpo_trainer.py``,
``GRPOTrainer._generate_and_score_completions``): group mean and std of *every* completion's reward,
``advantages = (rewards - mean) / (std + 1e-4)``, and only afterwards, under
``mask_truncated_completions``, ``completion_mask = completion_mask * (~is_truncated)``, which
affects the loss and nothing before it.
"""

import pytest
import torch

from arlopti.config import AlgorithmConfig, DapoConfig
from arlopti.learner.experience import Experience, without_truncated
from arlopti.learner.advantages import token_advantages


def _trl_order(rewards: list[float], truncated: list[bool], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's order, restated: advantages from all rewards of the group, then the loss mask."""
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = (r - r.mean()) / (r.std() + eps)  # torch.std: unbiased, as TRL's grouped std
    keep = ~torch.tensor(truncated)
    return adv.float(), keep


def _group(mask_truncated: bool):
    """The audit's group: rewards [-1 (truncated), 1, 0, 1], one prompt, 3-token responses."""
    mask = torch.ones(4, 3)
    exp = Experience(input_ids=torch.zeros(4, 5, dtype=torch.long), attention_mask=torch.ones(4, 5, dtype=torch.long),
                     response_mask=mask, prompt_len=2, rewards=torch.tensor([-1.0, 1.0, 0.0, 1.0]),
                     group_ids=torch.zeros(4, dtype=torch.long), truncated=torch.tensor([True, False, False, False]),
                     correct=torch.tensor([False, True, False, True]))
    algo = AlgorithmConfig(kl_coef=0.0, dapo=DapoConfig(mask_truncated=mask_truncated))
    loss_exp = without_truncated(exp) if mask_truncated else exp  # training_step's line
    return token_advantages(exp, torch.zeros(4, 3), None, loss_exp.response_mask, algo, lambda t: t), loss_exp


def test_truncated_reward_enters_the_group_statistics_and_leaves_the_loss():
    adv, loss_exp = _group(mask_truncated=True)
    eps = AlgorithmConfig().adv_eps
    ref_adv, keep = _trl_order([-1.0, 1.0, 0.0, 1.0], [True, False, False, False], eps)
    assert adv[1, 0].item() == pytest.approx(0.783, abs=5e-4)  # not 0.866, the value with r=-1 read as 0
    assert adv[1, 0].item() != pytest.approx(0.866, abs=5e-3)
    expected = ref_adv.unsqueeze(-1) * keep.float().unsqueeze(-1) * torch.ones(4, 3)
    torch.testing.assert_close(adv, expected, rtol=0, atol=2e-6)
    assert torch.equal(loss_exp.response_mask[0], torch.zeros(3))  # the truncated row is out of the loss


def test_without_masking_the_advantages_are_the_plain_group_ones():
    adv, _ = _group(mask_truncated=False)
    ref_adv, _ = _trl_order([-1.0, 1.0, 0.0, 1.0], [False] * 4, AlgorithmConfig().adv_eps)
    torch.testing.assert_close(adv, ref_adv.unsqueeze(-1).expand(4, 3), rtol=0, atol=2e-6)
