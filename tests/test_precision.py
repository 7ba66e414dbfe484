"""``trainer.precision=bf16-mixed`` on CPU: what runs in bf16, what stays fp32, and that a step completes.

Checked on a one-step run of the tiny model (GRPO + KL and Lopti, both log-prob impls):

* the rollout (HF ``generate``), the old / reference no-grad passes and the training forward all
  run their matmuls under ``torch.autocast(cpu, bfloat16)`` (a hook on a projection sees it);
* log-probs come back fp32 and finite; master weights, accumulated gradients and AdamW moments
  are fp32;
* every parameter stays finite and the step changes them.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                            SizesConfig)
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


def record_autocast(linear: torch.nn.Module, log: Counter, where: str) -> None:
    """Count forwards of ``linear`` by (where, grad enabled, autocast dtype or None, output dtype)."""
    def hook(mod, args, out):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        log[(where, torch.is_grad_enabled(), dtype, out.dtype)] += 1

    linear.register_forward_hook(hook)


@pytest.mark.parametrize("impl", ["naive", "fused"])
@pytest.mark.parametrize("lopti", [False, True])
def test_bf16_mixed_step_on_cpu(impl, lopti, tiny_tokenizer):
    algo = AlgorithmConfig(kl_coef=0.05, lopti=LoptiConfig(enabled=lopti, eta=0.002))
    cfg = RunConfig(algorithm=algo, model=ModelConfig(logprob_impl=impl),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=8))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    module.reuse_old_logprobs = False  # so that the old pass runs too (reuse is tested elsewhere)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    log: Counter = Counter()
    record_autocast(module.policy.hf.model.layers[0].self_attn.q_proj, log, "policy")
    record_autocast(module.ref.hf.model.layers[0].self_attn.q_proj, log, "ref")
    grad_dtypes: set = set()
    for p in module.policy.parameters():
        p.register_post_accumulate_grad_hook(lambda q: grad_dtypes.add(q.grad.dtype))
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(precision="bf16-mixed").fit(module, datamodule=dm)

    bf16 = torch.bfloat16
    kinds = set(log)
    # every forward of a projection ran under bf16 autocast with bf16 outputs: rollout, old, ref, train
    assert {k[2] for k in kinds} == {bf16} and {k[3] for k in kinds} == {bf16}
    assert ("policy", True, bf16, bf16) in kinds  # training forward (with grad)
    assert ("policy", False, bf16, bf16) in kinds  # rollout and the old-log-prob pass (no grad)
    assert ("ref", False, bf16, bf16) in kinds and ("ref", True, bf16, bf16) not in kinds
    # generate() calls the projection once per new token; the old pass once: more no-grad calls
    assert log[("policy", False, bf16, bf16)] > 8

    ctx = module.last_step_context
    assert ctx.old_log_probs.dtype == torch.float32 and torch.isfinite(ctx.old_log_probs).all()
    assert (ctx.old_log_probs[ctx.experience.response_mask.bool()] < 0).all()
    assert grad_dtypes == {torch.float32}  # gradients accumulate in the fp32 master weights' dtype
    opt = module.optimizers().optimizer
    for name, p in module.policy.named_parameters():
        assert p.dtype == torch.float32 and torch.isfinite(p).all(), name
        state = opt.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert any(not torch.equal(p.detach(), before[k]) for k, p in module.policy.named_parameters())
    m = ctx.metrics
    steps = [k for k in m if k.endswith("/grad_norm")]
    assert steps and all(torch.isfinite(torch.tensor(m[k])) for k in steps)
