"""The estimators beyond GRPO, Dr.GRPO and RLOO (REINFORCE++, OTB) and the token rewards they all read."""

import math

import pytest
import torch

from arlopti.algorithms import ADVANTAGE_ESTIMATORS, broadcast_to_tokens, grpo_advantages, rloo_advantages

# ------------------------------------------------------------------ token rewards and REINFORCE++

from arlopti.algorithms import outcome_token_rewards  # noqa: E402
from arlopti.plugins.advantages import (discounted_returns, masked_whiten, reinforce_pp_advantages,  # noqa: E402
                                        reinforce_pp_baseline_advantages)

MASK3 = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)


def test_outcome_reward_sits_on_each_responses_last_valid_token():
    got = outcome_token_rewards(torch.tensor([1.0, 2.0, 5.0]), MASK3)
    assert torch.equal(got, torch.tensor([[0, 0, 1.0, 0], [0, 2.0, 0, 0], [0, 0, 0, 0]]))


def test_a_multi_turn_episodes_outcome_reward_and_return_reach_its_earlier_turns():
    # turn 0 (2 tokens), the environment's reply (2 tokens, mask 0), turn 1 (1 token), padding
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    got = outcome_token_rewards(torch.tensor([3.0]), mask)
    assert torch.equal(got, torch.tensor([[0, 0, 0, 0, 3.0, 0]]))  # the last sampled token, not position sum - 1
    rewards = got + torch.tensor([[0, 0, 9.0, 9.0, 0, 7.0]])  # 9 on the reply and 7 on padding never flow back
    assert torch.allclose(discounted_returns(rewards, mask, 0.5), torch.tensor([[0.75, 1.5, 3.0, 3.0, 3.0, 7.0]]))


def test_discounted_returns_by_hand_and_reset_after_the_response():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])  # 7 sits on padding: it must not flow back
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert torch.allclose(discounted_returns(rewards, mask, 0.5), torch.tensor([[0.25, 0.5, 1.0, 7.0]]))
    assert torch.allclose(discounted_returns(rewards, mask, 1.0), torch.tensor([[1.0, 1.0, 1.0, 7.0]]))


def test_reinforce_pp_by_hand():
    # returns (gamma 1): [1, 1, 1 | 0, 0] over 5 valid tokens; mean 0.6; unbiased var
    # (3 * 0.16 + 2 * 0.36) / 5 * 5/4 = 0.3
    tr = outcome_token_rewards(torch.tensor([1.0, 0.0, 0.0]), MASK3)
    got = reinforce_pp_advantages(tr, MASK3, torch.tensor([0, 0, 1]))
    hi, lo = 0.4 / math.sqrt(0.3 + 1e-8), -0.6 / math.sqrt(0.3 + 1e-8)
    want = torch.tensor([[hi, hi, hi, 0], [lo, lo, 0, 0], [0, 0, 0, 0]])
    assert torch.allclose(got, want, atol=1e-6)


def _official_reinforce_pp(token_level_rewards, eos_mask, gamma):
    """zhyang2226/AR-Lopti verl/trainer/ppo/core_algos.py compute_reinforce_plus_plus_outcome_advantage
    with verl/utils/torch_functional.py masked_whiten/masked_var, restated loop for loop."""
    returns = torch.zeros_like(token_level_rewards)
    running = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * eos_mask[:, t]
    mean = (returns * eos_mask).sum() / eos_mask.sum()
    var = ((returns - mean) ** 2 * eos_mask).sum() / eos_mask.sum()
    var = var * eos_mask.sum() / (eos_mask.sum() - 1)
    return (returns - mean) * torch.rsqrt(var + 1e-8) * eos_mask


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_equals_the_official_restatement(gamma):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (6,), generator=g)
    mask = (torch.arange(8)[None, :] < lengths[:, None]).float()
    rewards = torch.randn(6, generator=g)
    tr = outcome_token_rewards(rewards, mask)
    tr = tr - 0.01 * torch.rand(6, 8, generator=g) * mask  # a per-token KL-in-reward term too
    got = reinforce_pp_advantages(tr, mask, None, gamma=gamma)
    assert torch.allclose(got, _official_reinforce_pp(tr.double(), mask.double(), gamma).float(), atol=1e-6)


def test_whitening_is_global_through_reduce():
    """Two ranks holding the same batch: each rank's sums doubled must give the whitening of the
    concatenated batch (what 2 ranks compute), not of its own half."""
    g = torch.Generator().manual_seed(1)
    x, mask = torch.randn(3, 5, generator=g), (torch.rand(3, 5, generator=g) > 0.3).float()
    both = masked_whiten(torch.cat([x, x]), torch.cat([mask, mask]))[:3]
    assert torch.allclose(masked_whiten(x, mask, reduce=lambda t: 2 * t), both, atol=1e-6)
    assert not torch.allclose(masked_whiten(x, mask), both, atol=1e-4)  # n/(n-1) differs


def test_whitening_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2 valid tokens"):
        masked_whiten(torch.ones(1, 2), torch.tensor([[1.0, 0.0]]))


def test_reinforce_pp_baseline_by_hand():
    # scores 1, 0 (group a), 3 (group b, alone: mean 0) -> centred 0.5, -0.5, 3 on 3 + 2 + 1 tokens
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    tr = outcome_token_rewards(torch.tensor([1.0, 0.0, 3.0]), mask)
    got = reinforce_pp_baseline_advantages(tr, mask, torch.tensor([0, 0, 1]))
    vals = torch.tensor([0.5, 0.5, 0.5, -0.5, -0.5, 3.0], dtype=torch.float64)
    mean, var = vals.mean(), vals.var(unbiased=True)
    want = ((torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0], [3.0, 0, 0]], dtype=torch.float64) - mean)
            / torch.sqrt(var + 1e-8)) * mask
    assert torch.allclose(got.double(), want, atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_group_estimators_score_the_sum_of_token_rewards(name):
    """With kl_in=reward the KL terms lower each response's score before the group baseline."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    tr = outcome_token_rewards(torch.tensor([1.0, 0.0]), mask) - 0.1 * mask
    got = ADVANTAGE_ESTIMATORS.get(name)(tr, mask, torch.tensor([0, 0]))
    scores = torch.tensor([1.0 - 0.2, 0.0 - 0.3])
    ref = {"grpo": grpo_advantages(scores, torch.tensor([0, 0])),
           "drgrpo": grpo_advantages(scores, torch.tensor([0, 0]), norm_by_std=False),
           "rloo": rloo_advantages(scores, torch.tensor([0, 0]))}[name]
    assert torch.allclose(got, broadcast_to_tokens(ref, mask))


def test_unknown_estimator_is_a_config_error_listing_the_known_ones():
    from arlopti.config import ConfigError, RunConfig, validate_run

    cfg = RunConfig()
    cfg.algorithm.advantage = "reinforce++"
    with pytest.raises(ConfigError, match="algorithm.advantage='reinforce\\+\\+'.*'reinforce_pp'"):
        validate_run(cfg)


# ------------------------------------------------------------------------------ OTB (arXiv 2602.07078)

from collections import defaultdict  # noqa: E402

from arlopti.algorithms.advantages import OldPolicyStats  # noqa: E402
from arlopti.plugins.advantages import otb_advantages, otb_token_weights  # noqa: E402


def verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, epsilon=1e-8,
             handle_zero_tail=True):
    """verl's compute_optimal_token_baseline_advantage (no rollout IS), restated; handle_zero_tail defaults to
    True as in verl since PR #5380 (v0.7.1)."""
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    w_cum = (w * response_mask).cumsum(dim=-1)
    groups = defaultdict(list)
    for i in range(len(index)):
        groups[index[i]].append(i)
    baselines = torch.zeros_like(returns)
    for rows in groups.values():
        if len(rows) == 1:
            continue
        t = torch.tensor(rows)
        num = (returns[t] * w_cum[t] * response_mask[t]).sum(0)
        den = (w_cum[t] * response_mask[t]).sum(0) + epsilon
        baselines[t] = (num / den).unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:  # the unique longest response's baseline is 0 from the second-longest length on
            lengths = response_mask[t].sum(-1)
            ordered = torch.sort(lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_max = (lengths == longest).nonzero(as_tuple=True)[0]
            if at_max.numel() == 1 and longest > second:
                baselines[rows[int(at_max[0])], second:] = 0.0
    return (returns - baselines) * response_mask


def _otb_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    b, t = 7, 6
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2])
    mask = (torch.arange(t) < lengths.unsqueeze(1)).float()
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.3])
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2])  # a group of one (id 2)
    logits = torch.randn(b, t, 5, generator=g) * 2
    probs = torch.softmax(logits, -1)
    old = torch.log(probs[..., 0])
    sum_p2 = (probs ** 2).sum(-1)
    return outcome_token_rewards(rewards, mask), mask, ids, old, sum_p2


@pytest.mark.parametrize("zero_tail", [True, False])
def test_otb_equals_verl(zero_tail):
    rewards, mask, ids, old, sum_p2 = _otb_batch()
    ours = otb_advantages(rewards, mask, ids, old=OldPolicyStats(old, sum_p2), zero_tail=zero_tail)
    ref = verl_otb(rewards, mask, ids.tolist(), old, sum_p2, handle_zero_tail=zero_tail)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=1e-6)
    assert ours[6].tolist() == pytest.approx([0.3, 0.3, 0, 0, 0, 0])  # a group of one: A = G (its reward-to-go)
    assert torch.all(ours[mask == 0] == 0)
    # both groups have a unique longest response (lengths 6 > 5 and 6 > 4): its tail has A = G with the zero
    # tail and A ~ 0 without (the baseline is its own return there)
    tail = ours[0, 5:].tolist() + ours[4, 4:].tolist()
    assert tail == (pytest.approx([1.0, 0.0, 0.0]) if zero_tail else pytest.approx([0.0, 0.0, 0.0], abs=1e-6))
    assert otb_advantages(rewards, mask, ids, old=OldPolicyStats(old, sum_p2)).equal(
        otb_advantages(rewards, mask, ids, old=OldPolicyStats(old, sum_p2), zero_tail=True))  # the default: on


def test_otb_zero_tail_by_hand():
    """Issue 45 §4: a group of three, lengths 3, 1, 1 (rewards 1, 0, 0), every token p = 0.5 with sum p^2 = 0.5,
    so w = 1 - 2 p + sum p^2 = 0.5 and W = 0.5, 1, 1.5 along the long response, 0.5 on the short ones. G is the
    outcome on every token. Position 0: B = (1 x 0.5 + 0 + 0) / 1.5 = 1/3. Positions 1-2: only the long
    response, B = G W / (W + 1e-8) ~ 1, so A ~ 0 there (off); verl's handle_zero_tail sets B = 0: A = G = 1 (on)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = outcome_token_rewards(torch.tensor([1.0, 0.0, 0.0]), mask)
    stats = OldPolicyStats(torch.full((3, 3), math.log(0.5)), torch.full((3, 3), 0.5))
    ids = torch.tensor([0, 0, 0])
    b0 = 0.5 / (1.5 + 1e-8)
    on = otb_advantages(rewards, mask, ids, old=stats)
    off = otb_advantages(rewards, mask, ids, old=stats, zero_tail=False)
    assert on.tolist() == [pytest.approx([1 - b0, 1.0, 1.0]), pytest.approx([-b0, 0, 0]), pytest.approx([-b0, 0, 0])]
    assert off[0].tolist() == pytest.approx([1 - b0, 1e-8, 1e-8 / 1.5], abs=1e-7) and off[1:].equal(on[1:])
    # a tie for the longest: no zero tail (verl: the longest must be unique)
    tie = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    r_tie = outcome_token_rewards(torch.tensor([1.0, 0.0, 0.0]), tie)
    assert otb_advantages(r_tie, tie, ids, old=stats).equal(otb_advantages(r_tie, tie, ids, old=stats, zero_tail=False))


def test_otb_zero_tail_is_a_setting_of_otb_only():
    from dataclasses import replace

    from arlopti.plugins.advantages import estimator_options
    from arlopti.config import AlgorithmConfig, ConfigError, RunConfig, validate_run

    otb = AlgorithmConfig(advantage="otb", otb_zero_tail=False)
    assert estimator_options(otb) == {"zero_tail": False} and AlgorithmConfig(advantage="otb").otb_zero_tail
    assert estimator_options(AlgorithmConfig()) == {}
    validate_run(RunConfig(algorithm=otb))
    with pytest.raises(ConfigError, match=r"algorithm\.otb_zero_tail=false is read by algorithm\.advantage=otb "
                                          r"only, and algorithm\.advantage=grpo; drop it or use experiment=kk_otb"):
        validate_run(RunConfig(algorithm=replace(otb, advantage="grpo")))


def test_otb_by_hand():
    # one group of two, one token each: G = r; W = 1 - 2 p + sum p^2; B = (r1 W1 + r2 W2) / (W1 + W2)
    rewards = torch.tensor([[1.0], [0.0]])
    mask = torch.ones(2, 1)
    old = torch.log(torch.tensor([[0.9], [0.5]]))
    sum_p2 = torch.tensor([[0.82], [0.5]])  # [0.9, 0.1] and [0.5, 0.5]
    w1, w2 = 1 - 1.8 + 0.82, 1 - 1.0 + 0.5  # 0.02 (a confident token) and 0.5
    b = (1.0 * w1 + 0.0 * w2) / (w1 + w2 + 1e-8)
    out = otb_advantages(rewards, mask, torch.tensor([0, 0]), old=OldPolicyStats(old, sum_p2))
    assert out[:, 0].tolist() == pytest.approx([1.0 - b, -b], abs=1e-6)  # float32 output
    # GRPO's baseline would be the plain mean 0.5: the uncertain response's return dominates OTB's
    assert b < 0.05


def test_otb_weights_at_the_extremes_and_the_needed_inputs():
    mask = torch.ones(1, 3)
    # p -> 1 (one-hot): 1 - 2 + 1 = 0; uniform over V = 4: 1 - 0.5 + 0.25 = 0.75; p -> 0 with mass elsewhere ~ 1 + sum p^2
    old = torch.log(torch.tensor([[1.0, 0.25, 1e-12]]))
    sum_p2 = torch.tensor([[1.0, 0.25, 1.0]])
    w = otb_token_weights(OldPolicyStats(old, sum_p2), mask)
    assert w[0].tolist() == pytest.approx([0.0, 0.75, 2.75])  # cumulative
    with pytest.raises(ValueError, match="otb needs the old policy's log-probs and sum of p\\^2"):
        otb_advantages(torch.ones(1, 3), mask, torch.tensor([0]))
    empty = otb_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 0]),
                           old=OldPolicyStats(torch.zeros(2, 3), torch.ones(2, 3)))
    assert torch.equal(empty, torch.zeros(2, 3))


def test_otb_advantages_at_a_ratio_of_20():
    """OTB's W reads pi_old only, so a policy that has moved to ratio 20 leaves A unchanged; in the PPO
    loss (clip 0.2 / 0.24, dual-clip 10, token-mean) both of test_otb_by_hand's tokens then sit on a flat
    branch: A > 0 clipped at -A (1 + 0.24), A < 0 capped at -A 10 (the uncapped -A r = 20 b exceeds it);
    no gradient. Without the dual-clip the A < 0 token keeps -A r = 20 b and its gradient 20 b / N."""
    from arlopti.algorithms import grpo_objective
    from arlopti.config import AlgorithmConfig

    rewards, mask = torch.tensor([[1.0], [0.0]]), torch.ones(2, 1)
    old = torch.log(torch.tensor([[0.9], [0.5]]))
    stats = OldPolicyStats(old, torch.tensor([[0.82], [0.5]]))
    b = 0.02 / (0.02 + 0.5 + 1e-8)  # test_otb_by_hand's baseline
    adv = otb_advantages(rewards, mask, torch.tensor([0, 0]), old=stats)
    assert adv[:, 0].tolist() == pytest.approx([1 - b, -b], abs=1e-6)
    for dual, want_loss, want_grad in ((10.0, (-(1 - b) * 1.24 + 10 * b) / 2, [0.0, 0.0]),
                                       (None, (-(1 - b) * 1.24 + 20 * b) / 2, [0.0, 20 * b / 2])):
        logp = (old + math.log(20.0)).requires_grad_(True)
        cfg = AlgorithmConfig(kl_coef=0.0, clip_low=0.2, clip_high=0.24, dual_clip=dual)
        loss, _ = grpo_objective(logp, old, adv, mask, mask, cfg)
        loss.backward()
        assert loss.item() == pytest.approx(want_loss, rel=1e-5)
        assert logp.grad[:, 0].tolist() == pytest.approx(want_grad, abs=1e-6)
