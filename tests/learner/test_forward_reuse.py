"""No wasted forwards: which forwards a step runs, and reusing the first training forward as π_old.

The reuse (``GRPOModule.reuse_old_logprobs``) must not change the update: with the same rollout
and weights, the parameters after the step equal those of the separate old-log-prob pass, for
GRPO, AR, Lopti and AR+Lopti, with one or several mini-batches and epochs.
"""

from __future__ import annotations

import pytest
import torch

from arlopti.config import AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from helpers.fixed_rollouts import FixedEngine
from helpers.toy import ToyDataModule, toy_trainer


def make(tok, algo: AlgorithmConfig, reuse: bool, optim: OptimConfig | None = None, **sizes) -> GRPOModule:
    s = dict(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=2, logprob_micro_batch_size=8)
    s.update(sizes)
    cfg = RunConfig(algorithm=algo, sizes=SizesConfig(**s),
                    optim=optim or OptimConfig(name="sgd", lr=1.0, weight_decay=0.0, grad_clip=None),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=16))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    module.reuse_old_logprobs = reuse
    module.rollout_engine = FixedEngine(tok)
    return module


def fit(module: GRPOModule, tok) -> GRPOModule:
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256)
    toy_trainer().fit(module, datamodule=dm)
    return module


def count_forwards(model) -> list[bool]:
    """Record ``torch.is_grad_enabled()`` at every forward of ``model``."""
    calls: list[bool] = []
    real = model.forward

    def spy(*a, **k):
        calls.append(torch.is_grad_enabled())
        return real(*a, **k)

    model.forward = spy
    return calls


def safe_eta(tok) -> float:
    """A Lopti threshold in a wide gap of this rollout's p_old, so float noise cannot move a token
    across it, with tokens on both sides."""
    module = fit(make(tok, AlgorithmConfig(kl_coef=0.0), reuse=False), tok)
    ctx = module.last_step_context
    p = torch.exp(ctx.old_log_probs)[ctx.experience.response_mask.bool()].sort().values
    n = len(p)
    mid = range(n // 4, 3 * n // 4)
    i = max(mid, key=lambda j: (p[j + 1] - p[j]) / p[j])
    return float((p[i] + p[i + 1]) / 2)


@pytest.fixture(scope="module")
def eta(tiny_tokenizer):
    return safe_eta(tiny_tokenizer)


def algos(eta: float) -> dict[str, AlgorithmConfig]:
    lo = LoptiConfig(enabled=True, eta=eta)
    return {
        "grpo_kl": AlgorithmConfig(kl_coef=0.05),
        "ar": AlgorithmConfig(ar_alpha=0.5, kl_coef=0.0),
        "lopti": AlgorithmConfig(kl_coef=0.05, lopti=lo),
        "ar_lopti_minibatch_2epochs": AlgorithmConfig(
            ar_alpha=0.3, kl_coef=0.05, ppo_epochs=2, lopti=LoptiConfig(enabled=True, eta=eta, granularity="minibatch")),
    }


@pytest.mark.parametrize("name,mini", [("grpo_kl", 8), ("ar", 8), ("lopti", 8), ("lopti", 4),
                                       ("ar_lopti_minibatch_2epochs", 4)])
def test_reuse_gives_the_same_update(name, mini, eta, tiny_tokenizer):
    algo = algos(eta)[name]
    runs = {}
    for reuse in (False, True):
        torch.manual_seed(0)
        runs[reuse] = fit(make(tiny_tokenizer, algo, reuse, mini_batch_size=mini), tiny_tokenizer)
    off, on = runs[False], runs[True]
    assert on.last_step_context.metrics["update/old_logprobs_reused_frac"] == mini / 8
    assert off.last_step_context.metrics["update/old_logprobs_reused_frac"] == 0
    if algo.lopti.enabled:
        for key in ("lopti/low_tokens", "lopti/high_tokens"):
            assert on.last_step_context.metrics[key] == off.last_step_context.metrics[key] > 0
    assert on.trainer.global_step == off.trainer.global_step
    c_on, c_off = on.last_step_context, off.last_step_context
    torch.testing.assert_close(c_on.old_log_probs, c_off.old_log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_on.advantages, c_off.advantages, rtol=1e-5, atol=1e-6)
    for a, b in zip(on.policy.parameters(), off.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_reuse_with_adamw_and_clipping(eta, tiny_tokenizer):
    """AdamW + global-norm clipping on top: still the same parameters."""
    algo = algos(eta)["lopti"]
    adamw = OptimConfig(name="adamw", lr=1e-3, weight_decay=0.01, grad_clip=0.5)
    off = fit(make(tiny_tokenizer, algo, False, optim=adamw), tiny_tokenizer)
    on = fit(make(tiny_tokenizer, algo, True, optim=adamw), tiny_tokenizer)
    for a, b in zip(on.policy.parameters(), off.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_empty_first_phase_is_still_skipped_with_reuse(tiny_tokenizer):
    module = fit(make(tiny_tokenizer, AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=1e-12)), True,
                      mini_batch_size=4), tiny_tokenizer)
    m = module.last_step_context.metrics
    assert m["update/low/skipped_empty"] == 1.0 and m["update/old_logprobs_reused_frac"] == 0.5
    assert module.trainer.global_step == 2  # the high phase's two mini-batches only


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
@pytest.mark.parametrize("reuse", [False, True])
def test_forward_count(kl_coef, reuse, tiny_tokenizer):
    """One mini-batch of 8 rows in micro-batches of 2: 4 training forwards with grad; the old pass
    (one no-grad chunk of 8) only without reuse; the reference pass only when β > 0."""
    module = make(tiny_tokenizer, AlgorithmConfig(kl_coef=kl_coef), reuse)
    policy_calls = count_forwards(module.policy)
    ref_calls = count_forwards(module.ref) if module.ref is not None else []
    fit(module, tiny_tokenizer)
    assert (module.ref is None) == (kl_coef == 0)
    assert policy_calls.count(True) == 4
    assert policy_calls.count(False) == (0 if reuse else 1)
    assert ref_calls == ([False] if kl_coef > 0 else [])


def test_no_reuse_under_phase_normalisation(tiny_tokenizer):
    algo = AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=0.002, normalize="phase"))
    module = make(tiny_tokenizer, algo, True)
    calls = count_forwards(module.policy)
    fit(module, tiny_tokenizer)
    assert module.last_step_context.metrics["update/old_logprobs_reused_frac"] == 0
    assert calls.count(False) == 1
