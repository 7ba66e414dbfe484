"""``trainer.precision=bf16-mixed`` on CPU: what runs in bf16, what stays fp32, and that a step completes.

Checked on a one-step run of the tiny model (GRPO + KL and Lopti, both log-prob impls):

* the old / reference no-grad passes and the training forward run their matmuls under
  ``torch.autocast(cpu, bfloat16)`` (a hook on a projection sees it); the HF engine decodes the fp32 weights
  on packed copies outside autocast (the CPU's fastest path; on a GPU it decodes under the trainer's autocast);
* log-probs come back fp32 and finite; master weights, accumulated gradients and AdamW moments
  are fp32;
* every parameter stays finite and the step changes them;
* issue 49: the set-up spreads the fp32 masters within their bf16 rounding intervals (casts unchanged), so that
  an update smaller than half a bf16 step reaches the bf16 forward in expectation; and every bf16 forward sees
  a fresh cast of the weights (Lightning's autocast caches none: Lopti's second step is not computed on the
  first one's casts).
"""

from __future__ import annotations

from collections import Counter

import lightning.pytorch as L
import pytest
import torch

from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                            SizesConfig)
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


def record_fresh_casts(linear: torch.nn.Module, log: list) -> None:
    """For each forward of ``linear`` under bf16 autocast, whether its output is what a fresh bf16 cast of its
    weights gives now (False: autocast reused a cast of weights an optimizer step has since changed)."""
    def hook(mod, args, out):
        if not torch.is_autocast_enabled("cpu"):
            return
        with torch.autocast("cpu", enabled=False):
            bias = None if mod.bias is None else mod.bias.detach().to(out.dtype)
            fresh = torch.nn.functional.linear(args[0].detach().to(out.dtype), mod.weight.detach().to(out.dtype), bias)
        log.append(torch.equal(out.detach(), fresh))

    linear.register_forward_hook(hook)


def record_autocast(linear: torch.nn.Module, log: Counter, where: str) -> None:
    """Count forwards of ``linear`` by (where, grad enabled, autocast dtype or None, output dtype)."""
    def hook(mod, args, out):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        log[(where, torch.is_grad_enabled(), dtype, out.dtype)] += 1

    linear.register_forward_hook(hook)


class MastersAtFitStart(L.Callback):
    """The policy's weights as the fit starts (after the learner's set-up)."""

    def on_fit_start(self, trainer, pl_module):
        self.weights = {k: v.detach().clone() for k, v in pl_module.policy.named_parameters()}


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
    with torch.no_grad():  # as loaded from a bf16 checkpoint: every master weight on the bf16 grid
        for p in module.policy.parameters():
            p.copy_(p.to(torch.bfloat16))
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    log: Counter = Counter()
    record_autocast(module.policy.hf.model.layers[0].self_attn.q_proj, log, "policy")
    record_autocast(module.ref.hf.model.layers[0].self_attn.q_proj, log, "ref")
    fresh: list = []
    record_fresh_casts(module.policy.hf.model.layers[0].mlp.down_proj, fresh)
    grad_dtypes: set = set()
    for p in module.policy.parameters():
        p.register_post_accumulate_grad_hook(lambda q: grad_dtypes.add(q.grad.dtype))
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    at_start = MastersAtFitStart()
    toy_trainer(precision="bf16-mixed", callbacks=[at_start]).fit(module, datamodule=dm)

    bf16 = torch.bfloat16
    kinds = set(log)
    # the engine's prefill ran the fp32 projection outside autocast (its decoding steps run the packed copies);
    # every other forward, the learner's (old, ref, train), ran under bf16 autocast with bf16 outputs
    assert ("policy", False, None, torch.float32) in kinds
    assert {k for k in kinds if k[2] is None} == {("policy", False, None, torch.float32)}
    assert {k[3] for k in kinds if k[2] is not None} == {bf16}
    assert ("policy", True, bf16, bf16) in kinds  # training forward (with grad)
    assert ("policy", False, bf16, bf16) in kinds  # the old-log-prob pass (no grad)
    assert ("ref", False, bf16, bf16) in kinds and ("ref", True, bf16, bf16) not in kinds
    # the CPU engine decodes the fp32 masters on packed weights outside autocast (its projections run packed,
    # unseen by the hooks): the fastest path measured under a bf16 trainer (issue 49)
    engine = module.rollout_engine
    assert engine.autocast_dtype is None and engine.packed is not None and engine.packed.groups

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
    # every bf16 forward saw the weights as they were then (Lightning's autocast runs with cache_enabled=False;
    # a cached cast would carry the weights from before Lopti's first step into its second)
    assert fresh and all(fresh), fresh
    # the set-up spread the masters within their bf16 rounding intervals: casts as loaded, values off the grid
    for name, w in at_start.weights.items():
        assert torch.equal(w.to(torch.bfloat16), before[name].to(torch.bfloat16)), name
    matrices = [k for k, w in at_start.weights.items() if w.dim() >= 2]
    moved = sum(int((at_start.weights[k] != before[k]).sum()) for k in matrices)
    assert moved > 0.9 * sum(before[k].numel() for k in matrices)
    m = ctx.metrics
    steps = [k for k in m if k.endswith("/grad_norm")]
    assert steps and all(torch.isfinite(torch.tensor(m[k])) for k in steps)


def on_grid(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` fp32 values that bf16 represents exactly, a few special ones first."""
    w = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[:4] = torch.tensor([0.0, 1.0, -2.0 ** -10, 3.0e38])
    return w.to(torch.bfloat16).float()


def test_spread_moves_grid_values_within_their_rounding_interval():
    from arlopti.utils.precision import spread_within_rounding

    w = on_grid(20_000)
    off = torch.tensor([0.0123456789])  # not on the bf16 grid: left alone
    w = torch.cat([w, off])
    start = w.clone()
    moved = spread_within_rounding(w, torch.bfloat16, torch.Generator().manual_seed(1))
    assert torch.equal(w.to(torch.bfloat16), start.to(torch.bfloat16))  # the forward's casts are unchanged
    assert w[0] == 0 and w[-1] == off[0]
    assert moved == int((w != start).sum()) and moved > 0.99 * (w.numel() - 2)


def test_after_the_spread_a_small_update_reaches_the_cast_in_expectation():
    from arlopti.utils.precision import spread_within_rounding

    start = on_grid(200_000, seed=2)[4:]
    pick = (start.abs() > 0.03) & (start.abs() < 0.06)  # half a bf16 step here: 6e-5 to 1.2e-4
    update = 3e-5  # below half a step: invisible to the cast of a weight on the grid
    spread = start.clone()
    spread_within_rounding(spread, torch.bfloat16, torch.Generator().manual_seed(3))

    def shift(w):
        return float(((w + update).to(torch.bfloat16).float() - start)[pick].mean()) / update

    assert shift(start) == 0.0
    assert 0.9 < shift(spread) < 1.1


def test_spread_master_weights_moves_trainable_fp32_matrices_only():
    from arlopti.utils.precision import spread_master_weights

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    model[2].weight.requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    assert spread_master_weights(model, None) == 0 and spread_master_weights(model, torch.float32) == 0
    moved = spread_master_weights(model, torch.bfloat16, seed=5)
    changed = {k for k, v in model.named_parameters() if not torch.equal(v, start[k])}
    assert changed == {"0.weight"} and moved == int((model[0].weight != start["0.weight"]).sum())
    again = torch.nn.Linear(16, 16)
    with torch.no_grad():
        again.weight.copy_(start["0.weight"])
    spread_master_weights(again, torch.bfloat16, seed=5)
    assert torch.equal(again.weight, model[0].weight)  # seeded: every rank spreads alike


@pytest.mark.parametrize(("value", "want"), [("bf16-mixed", torch.bfloat16), ("bfloat16-mixed", torch.bfloat16),
                                             ("16-mixed", torch.float16), ("fp16-mixed", torch.float16),
                                             ("32-true", None), ("bf16-true", None), ("auto", None), (None, None)])
def test_mixed_compute_dtype(value, want):
    from arlopti.utils.precision import mixed_compute_dtype

    assert mixed_compute_dtype(value) == want


def test_the_hf_engine_autocasts_under_a_bf16_trainer_on_a_gpu_only():
    from arlopti.rollout.factory import autocast_of

    for device in (None, "cpu", torch.device("cpu")):
        assert autocast_of("bf16-mixed", device) is None
    assert autocast_of("bf16-mixed", "cuda") == torch.bfloat16 == autocast_of("bf16-true", torch.device("cuda", 0))
    assert autocast_of("32-true", "cuda") is None


class StopAtFitStart(L.Callback):
    def on_fit_start(self, trainer, pl_module):
        trainer.should_stop = True


@pytest.mark.parametrize("spread", [True, False])
def test_the_spread_is_switched_by_model_spread_master_weights(spread, tiny_tokenizer):
    """fidelity=official (model.spread_master_weights=false) leaves the masters on the checkpoint's grid."""
    cfg = RunConfig(model=ModelConfig(spread_master_weights=spread),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    with torch.no_grad():
        for p in module.policy.parameters():
            p.copy_(p.to(torch.bfloat16))
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    at_start = MastersAtFitStart()
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(precision="bf16-mixed", callbacks=[at_start, StopAtFitStart()]).fit(module, datamodule=dm)
    same = all(torch.equal(w, before[k]) for k, w in at_start.weights.items())
    assert same is not spread
