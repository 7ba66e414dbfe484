"""Token-budget micro-batches: the packing functions, and the learner's update independent of the split."""

from __future__ import annotations

import random

import pytest
import torch

from arlopti.config import (AlgorithmConfig, ConfigError, LoptiConfig, OptimConfig, RolloutConfig, RunConfig,
                            SizesConfig, validate_run)
from arlopti.learner.microbatch import (balanced_partition, fixed_micro_batches, micro_batch_cost,
                                        min_micro_batches, plan_micro_batches)
from arlopti.learner.module import GRPOModule
from helpers.fixed_rollouts import FixedEngine
from helpers.toy import ToyDataModule, toy_trainer


def set_partitions(items: list[int]):
    """Every partition of ``items`` into non-empty blocks (Bell-number many; small inputs only)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[head], *part]
        for i in range(len(part)):
            yield part[:i] + [[head, *part[i]]] + part[i + 1:]


def costs(parts, lengths, prompt_len):
    return [micro_batch_cost([lengths[i] for i in p], prompt_len) for p in parts]


def test_cost_is_rows_times_prompt_plus_longest():
    assert micro_batch_cost([3, 7, 5], 10) == 3 * 17
    assert micro_batch_cost([0, 0], 4) == 2 * 5  # an empty response still takes one position
    assert micro_batch_cost([], 4) == 0


@pytest.mark.parametrize("seed", range(12))
def test_fewest_micro_batches_and_balance_match_brute_force(seed):
    """Against every set partition of up to 7 rows: the same minimal count and min-max cost."""
    rng = random.Random(seed)
    n, prompt_len = rng.randint(1, 7), rng.randint(0, 6)
    lengths = [rng.randint(0, 20) for _ in range(n)]
    budget = rng.randint(prompt_len + max(max(lengths), 1), 4 * (prompt_len + 20))
    best_k = min(len(p) for p in set_partitions(list(range(n))) if max(costs(p, lengths, prompt_len)) <= budget)
    assert min_micro_batches(lengths, prompt_len, budget) == best_k
    for k in range(1, n + 1):
        optimum = min(max(costs(p, lengths, prompt_len)) for p in set_partitions(list(range(n))) if len(p) == k)
        parts = balanced_partition(lengths, prompt_len, k)
        assert len(parts) == k and all(parts)
        assert sorted(i for p in parts for i in p) == list(range(n))
        assert max(costs(parts, lengths, prompt_len)) == optimum


def test_plan_fits_the_budget_and_pads_little_on_a_wide_spread():
    rng = random.Random(0)
    lengths = [rng.randint(50, 1000) for _ in range(64)]
    plan = plan_micro_batches(lengths, 100, 4096)
    assert sorted(i for mb in plan.micro_batches for i in mb) == list(range(64))
    assert all(c <= 4096 for c in costs(plan.micro_batches, lengths, 100))
    assert len(plan.micro_batches) == min_micro_batches(lengths, 100, 4096)
    assert plan.padded_tokens == sum(costs(plan.micro_batches, lengths, 100))
    valid = sum(lengths) + 64 * 100
    assert valid / plan.padded_tokens > 0.9  # fixed chunks of 4 in row order pad far more:
    fixed = sum(costs(fixed_micro_batches(64, 4), lengths, 100))
    assert valid / fixed < 0.8


def test_oversized_rows_go_alone_and_the_rest_still_fits():
    plan = plan_micro_batches([5000, 10, 20, 3000, 30], prompt_len=100, budget=1024)
    assert plan.oversized == [0, 3]
    assert plan.micro_batches[:2] == [[0], [3]]
    rest = plan.micro_batches[2:]
    assert all(c <= 1024 for c in costs(rest, [5000, 10, 20, 3000, 30], 100))
    assert sorted(i for mb in rest for i in mb) == [1, 2, 4]


def test_forced_count_and_bad_input():
    plan = plan_micro_batches([5, 10, 20, 30], 100, 100_000, k=4)  # e.g. another rank needs 4
    assert sorted(plan.micro_batches) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="need between 2 and 4"):
        plan_micro_batches([5, 10, 20, 30], 100, 300, k=1)
    with pytest.raises(ValueError, match="micro_batch_tokens=0"):
        min_micro_batches([1], 1, 0)
    with pytest.raises(ValueError, match="k=5"):
        balanced_partition([1, 2], 0, 5)


def test_config_validation_of_the_budget():
    bad = RunConfig(sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_tokens=-5))
    with pytest.raises(ConfigError, match="sizes.micro_batch_tokens=-5"):
        validate_run(bad)
    # with a budget, micro_batch_size no longer has to divide the mini-batch
    validate_run(RunConfig(sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4,
                                             micro_batch_size=3, micro_batch_tokens=64)))


# ------------------------------------------------------------------------------ the learner

ETA = 0.002  # near 1/vocab of the random tiny model: both Lopti phases get tokens


def run(tok, algo: AlgorithmConfig, **sizes) -> GRPOModule:
    s = dict(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=1, logprob_micro_batch_size=8)
    s.update(sizes)
    cfg = RunConfig(algorithm=algo, sizes=SizesConfig(**s),
                    # SGD, no clipping: the parameter change is the gradient itself
                    optim=OptimConfig(name="sgd", lr=1.0, weight_decay=0.0, grad_clip=None),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=24))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    module.rollout_engine = FixedEngine(tok)
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256)
    toy_trainer().fit(module, datamodule=dm)
    return module


def flat_params(module: GRPOModule) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()])


@pytest.mark.parametrize("algo", [
    AlgorithmConfig(kl_coef=0.01),
    AlgorithmConfig(ar_alpha=0.3, kl_coef=0.01, lopti=LoptiConfig(enabled=True, eta=ETA)),
], ids=["grpo", "ar_lopti"])
def test_token_budget_gives_the_update_of_fixed_micro_batches(algo, tiny_tokenizer):
    """Same rollout (varied lengths), same weights: budget-packed and fixed micro-batches give the
    same parameters, because every micro-batch is normalised by the mini-batch's token count."""
    fixed = run(tiny_tokenizer, algo, micro_batch_size=1)
    exp = fixed.last_step_context.experience
    lengths = exp.response_mask.sum(-1).tolist()
    assert len(set(lengths)) > 3, "the rollout must have varied lengths for the split to matter"
    budget = 3 * (exp.prompt_len + 24)  # several multi-row micro-batches of unequal sizes
    packed = run(tiny_tokenizer, algo, micro_batch_tokens=budget)
    plan = packed._micro_batches(list(range(8)), packed.last_step_context.experience)
    assert 1 < len(plan) < 8 and any(len(mb) > 1 for mb in plan)
    torch.testing.assert_close(flat_params(packed), flat_params(fixed), rtol=1e-5, atol=1e-6)
    m_packed, m_fixed = packed.last_step_context.metrics, fixed.last_step_context.metrics
    if algo.lopti.enabled:
        assert m_fixed["lopti/low_tokens"] > 0 and m_fixed["lopti/high_tokens"] > 0
    assert m_packed["update/micro_batches"] == len(plan) and m_fixed["update/micro_batches"] == 8
    # one row per micro-batch has no response padding, packing some
    assert m_fixed["update/valid_token_frac"] >= m_packed["update/valid_token_frac"] > 0.5


def test_microbatch_scope_depends_on_the_split(tiny_tokenizer):
    """``token_mean_scope=microbatch`` (verl 0.2) averages per-micro-batch means: the split matters."""
    algo = AlgorithmConfig(kl_coef=0.0, token_mean_scope="microbatch")
    a = run(tiny_tokenizer, algo, micro_batch_size=1)
    b = run(tiny_tokenizer, algo, micro_batch_size=8)
    assert not torch.allclose(flat_params(a), flat_params(b), rtol=1e-5, atol=1e-6)


def test_oversized_sequence_warns_once(tiny_tokenizer, caplog):
    with caplog.at_level("WARNING", logger="arlopti.learner.module"):
        module = run(tiny_tokenizer, AlgorithmConfig(kl_coef=0.0), micro_batch_tokens=1)
    assert module.last_step_context.metrics["update/micro_batches"] == 8
    warnings = [r for r in caplog.records if "micro_batch_tokens=1 is below" in r.getMessage()]
    assert len(warnings) == 1
