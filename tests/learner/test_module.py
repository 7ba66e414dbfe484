"""GRPOModule on the tiny model: parameters change, step counts, empty phases, non-finite steps."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.config import (AlgorithmConfig, ConfigError, LoptiConfig, OptimConfig, RolloutConfig, RunConfig,
                            SizesConfig)
from arlopti.learner.module import GRPOModule, NonFiniteAbort
from helpers.toy import ToyDataModule, toy_trainer

# A random model puts p_old near 1/vocab (~0.002) on every token: this eta splits them in two.
ETA = 0.002
ALGOS = {
    "grpo": AlgorithmConfig(),
    "ar": AlgorithmConfig(name="ar", ar_alpha=0.3),
    "lopti": AlgorithmConfig(name="lopti", lopti=LoptiConfig(enabled=True, eta=ETA)),
    "ar_lopti": AlgorithmConfig(name="ar_lopti", ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=ETA)),
}


def make_cfg(algo: AlgorithmConfig, **sizes) -> RunConfig:
    s = dict(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2, logprob_micro_batch_size=8)
    s.update(sizes)
    return RunConfig(algorithm=algo, sizes=SizesConfig(**s), optim=OptimConfig(lr=1e-2),
                     rollout=RolloutConfig(temperature=1.0, max_new_tokens=12))


def fit(cfg: RunConfig, tok, steps: int = 1, **trainer_kw) -> GRPOModule:
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=cfg.sizes.prompts_per_step, max_prompt_length=256)
    toy_trainer(**trainer_kw).fit(module, datamodule=dm)
    return module


@pytest.mark.parametrize("name", list(ALGOS))
def test_every_trainable_parameter_changes_and_reference_does_not(name, tiny_tokenizer):
    cfg = make_cfg(ALGOS[name])
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    ref_before = {k: v.detach().clone() for k, v in module.ref.named_parameters()}
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer().fit(module, datamodule=dm)
    ctx = module.last_step_context
    assert ctx.metrics["reward/std"] > 0, "the toy reward must vary for the test to mean anything"
    unchanged = [k for k, v in module.policy.named_parameters() if torch.equal(v.detach(), before[k])]
    assert not unchanged, f"{name}: parameters did not change: {unchanged}"
    for k, v in module.ref.named_parameters():
        assert torch.equal(v, ref_before[k]), f"reference parameter {k} changed"
        assert not v.requires_grad


def test_lopti_takes_twice_the_optimizer_steps_of_grpo(tiny_tokenizer):
    steps = {}
    for name in ("grpo", "lopti"):
        module = fit(make_cfg(ALGOS[name]), tiny_tokenizer, steps=2)
        assert module.rollout_step == 2
        steps[name] = module.trainer.global_step
        if name == "lopti":
            assert module.last_step_context.metrics["update/low/skipped_empty"] == 0
            assert module.last_step_context.metrics["update/high/skipped_empty"] == 0
    # 8 responses per step / mini-batch 4 = 2 optimizer steps per phase, 2 rollout steps
    assert steps == {"grpo": 4, "lopti": 8}


@pytest.mark.parametrize("lopti, expected", [
    (LoptiConfig(enabled=True, eta=ETA), [("low", 0), ("low", 4), ("high", 0), ("high", 4)]),
    (LoptiConfig(enabled=True, eta=ETA, granularity="minibatch"), [("low", 0), ("high", 0), ("low", 4), ("high", 4)]),
    (LoptiConfig(enabled=True, eta=ETA, reverse=True), [("high", 0), ("high", 4), ("low", 0), ("low", 4)]),
], ids=["batch", "minibatch", "reverse"])
def test_the_learner_takes_one_step_per_entry_of_its_plan(lopti, expected, tiny_tokenizer, monkeypatch):
    """The plan comes from ``step_order`` (tests/algorithms/test_plan.py checks it) with the config's
    granularity and order, and the learner takes exactly one optimizer step per entry."""
    import arlopti.learner.module as mod
    from arlopti.algorithms.plan import step_order

    plans = []

    def recording(*a, **k):
        plans.append(step_order(*a, **k))
        return plans[-1]

    monkeypatch.setattr(mod, "step_order", recording)
    module = fit(make_cfg(AlgorithmConfig(lopti=lopti)), tiny_tokenizer)
    assert len(plans) == 1 and [(phase, rows[0]) for phase, rows in plans[0]] == expected
    assert module.trainer.global_step == len(plans[0])


def test_empty_phase_takes_no_step(tiny_tokenizer):
    # eta so small that no token of a random 500-token-vocab model falls below it
    algo = AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=1e-12))
    module = fit(make_cfg(algo), tiny_tokenizer)
    m = module.last_step_context.metrics
    assert m["update/low/skipped_empty"] == 1.0 and m["lopti/low_tokens"] == 0
    assert module.trainer.global_step == 2  # only the high phase's 2 mini-batches


def test_nonfinite_steps_are_skipped_then_abort(tiny_tokenizer, monkeypatch):
    import arlopti.learner.module as mod

    real = mod.grpo_objective
    calls = {"n": 0}

    def sometimes_nan(*a, **k):
        loss, m = real(*a, **k)
        calls["n"] += 1
        return (loss * math.nan if calls["n"] <= 2 else loss), m

    monkeypatch.setattr(mod, "grpo_objective", sometimes_nan)
    cfg = make_cfg(AlgorithmConfig(max_consecutive_skips=5))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer().fit(module, datamodule=dm)
    # micro-batches 1 and 2 (the first optimizer step) were NaN: that step is skipped, the second taken
    assert module.total_skips == 1 and module.trainer.global_step == 1
    assert module.last_step_context.metrics["update/nonfinite_skips"] == 1
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())
    assert any(not torch.equal(v.detach(), before[k]) for k, v in module.policy.named_parameters())

    monkeypatch.setattr(mod, "grpo_objective", lambda *a, **k: (real(*a, **k)[0] * math.nan, {}))
    cfg = make_cfg(AlgorithmConfig(max_consecutive_skips=2))
    with pytest.raises(NonFiniteAbort, match="2 consecutive optimizer steps had a non-finite"):
        fit(cfg, tiny_tokenizer, steps=3)


def test_token_mean_is_independent_of_micro_batch_split(tiny_tokenizer):
    """Same rollout, same weights: micro-batch 1, 2 or 4 gives the same update."""
    params = []
    for micro in (1, 2, 4):
        torch.manual_seed(0)
        cfg = make_cfg(AlgorithmConfig(kl_coef=0.001), micro_batch_size=micro)
        # SGD: the parameter change is the gradient itself (Adam would amplify float noise)
        cfg.optim = OptimConfig(name="sgd", lr=1.0, weight_decay=0.0, grad_clip=None)
        module = fit(cfg, tiny_tokenizer)
        params.append(torch.cat([p.detach().flatten() for p in module.policy.parameters()]))
    torch.testing.assert_close(params[0], params[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params[0], params[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change,key", [
    (dict(algorithm=AlgorithmConfig(ar_alpha=1.5)), "algorithm.ar_alpha"),
    (dict(algorithm=AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=1.0))), "algorithm.lopti.eta"),
    (dict(algorithm=AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=0.0))), "algorithm.lopti.eta"),
    (dict(sizes=SizesConfig(group_size=1, prompts_per_step=2, mini_batch_size=2, micro_batch_size=1)),
     "sizes.group_size"),
    (dict(sizes=SizesConfig(prompts_per_step=3, group_size=4, mini_batch_size=8, micro_batch_size=2)),
     "sizes.mini_batch_size=8 must divide the 12 responses"),
    (dict(sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=3)),
     "sizes.micro_batch_size=3"),
])
def test_bad_configs_name_the_key(change, key, tiny_tokenizer):
    from arlopti.config import validate_run

    cfg = RunConfig(**change)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
        validate_run(cfg)


def test_world_size_must_divide_prompts():
    from arlopti.config import validate_run

    cfg = RunConfig(sizes=SizesConfig(prompts_per_step=3, group_size=4, mini_batch_size=12, micro_batch_size=3))
    with pytest.raises(ConfigError, match="prompts_per_step=3 is not divisible by the 2"):
        validate_run(cfg, world_size=2)
