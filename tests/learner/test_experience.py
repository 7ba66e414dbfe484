"""The experience helpers the learner uses: truncation masking (DAPO) and moving to a device."""

import torch

from arlopti.config import AlgorithmConfig, DapoConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.experience import Experience, to_device, without_truncated
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


def _exp() -> Experience:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return Experience(input_ids=torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 5, dtype=torch.long),
                      response_mask=mask, prompt_len=2, rewards=torch.tensor([1.0, 0.0]),
                      group_ids=torch.tensor([0, 0]), truncated=torch.tensor([False, True]),
                      correct=torch.tensor([True, False]), engine_logprobs=torch.zeros(2, 3))


def test_truncated_responses_leave_the_mask_and_the_original_is_kept():
    exp = _exp()
    masked = without_truncated(exp)
    assert torch.equal(masked.response_mask, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(exp.response_mask, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))  # metrics still see it


def test_to_device_moves_the_engine_logprobs_too():
    exp = to_device(_exp(), "meta")
    assert exp.engine_logprobs.device.type == "meta" and exp.response_mask.device.type == "meta"


def test_select_and_to_device_carry_the_policy_versions():
    exp = _exp()
    assert exp.policy_versions is None and exp.select([1]).policy_versions is None  # colocated
    exp.policy_versions = torch.tensor([4, 6])
    assert exp.select([1, 0]).policy_versions.tolist() == [6, 4]
    assert to_device(exp, "meta").policy_versions.device.type == "meta"


def test_a_step_whose_responses_are_all_truncated_does_not_move_the_policy(tiny_tokenizer):
    """The tiny random model never samples EOS in 6 tokens: every response is truncated, so with
    mask_truncated nothing is left in the loss and the (empty) step is skipped."""
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.0, dapo=DapoConfig(mask_truncated=True)),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4),
                    optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    toy_trainer().fit(module, datamodule=ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2,
                                                        max_prompt_length=256))
    ctx = module.last_step_context
    assert ctx.experience.truncated.all()
    assert ctx.metrics["rollout/truncated_frac"] == 1.0
    assert module.trainer.global_step == 0  # no optimizer step
    assert all(torch.equal(v, before[k]) for k, v in module.policy.named_parameters())
