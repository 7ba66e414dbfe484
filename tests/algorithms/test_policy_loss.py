"""Policy loss, clipping, dual-clip and every aggregation mode against hand-computed values."""

import math

import pytest
import torch

from arlopti.algorithms import Clip, aggregate, policy_loss
from arlopti.algorithms.aggregation import Aggregation
from arlopti.algorithms.policy_loss import per_token_policy_loss

# Two sequences x 3 positions. Ratios are set through log_probs - old_log_probs.
RATIO = torch.tensor([[1.1, 1.5, 1.0], [0.5, 20.0, 1.0]])
ADV = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.full((2, 3), -1.0)
LOGP = OLD + torch.log(RATIO)
# Per token: -1.1 (unclipped), -1.24 (clip high: A>0, ratio>1.24), 0.8 (clip low: A<0, ratio<0.8),
# 10 (dual-clip: -A*ratio = 20 capped at -A*c = 10), 0 (A = 0).
PER_TOKEN = torch.tensor([[-1.1, -1.24, 0.0], [0.8, 10.0, 0.0]])
# the settings PER_TOKEN is computed with (the schema's defaults; the functions have none of their own)
PPO = {"clip": Clip(0.2, 0.24, 10.0), "name": "ppo_clip"}
GSPO = {"clip_low": 3e-4, "clip_high": 4e-4, "dual_clip": None}  # configs/algorithm/gspo.yaml


def test_per_token_values_and_indicators():
    loss, ind = per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, 10.0, name="ppo_clip")
    torch.testing.assert_close(loss, PER_TOKEN, rtol=0, atol=1e-5)
    assert ind["clip_high"].tolist() == [[False, True, False], [False, False, False]]
    assert ind["clip_low"].tolist() == [[False, False, False], [True, False, False]]
    assert ind["clip_dual"].tolist() == [[False, False, False], [False, True, False]]


@pytest.mark.parametrize("agg,expected", [
    ("token-mean", (-1.1 - 1.24 + 0.8 + 10.0) / 5),
    ("seq-mean-token-mean", ((-1.1 - 1.24) / 2 + (0.8 + 10.0) / 3) / 2),
    ("seq-mean-token-sum", ((-1.1 - 1.24) + (0.8 + 10.0)) / 2),
    ("seq-mean-token-sum-norm", (-1.1 - 1.24 + 0.8 + 10.0) / (2 * 3)),
])
def test_aggregation_modes(agg, expected):
    loss, m = policy_loss(LOGP, OLD, ADV, MASK, Clip(0.2, 0.24, 10.0), Aggregation(agg), name="ppo_clip")
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert m["clip_frac_high"] == pytest.approx(1 / 5)
    assert m["clip_frac_low"] == pytest.approx(1 / 5)
    assert m["clip_frac_dual"] == pytest.approx(1 / 5)
    assert m["ratio_max"] == pytest.approx(20.0, rel=1e-5)


def test_scale_and_horizon_override_denominators():
    loss_tok = torch.ones(2, 3)
    assert aggregate(loss_tok, MASK, "token-mean", scale=10.0).item() == pytest.approx(0.5)
    assert aggregate(loss_tok, MASK, "seq-mean-token-sum", scale=4.0).item() == pytest.approx(5 / 4)
    assert aggregate(loss_tok, MASK, "seq-mean-token-sum-norm", horizon=5).item() == pytest.approx(5 / 10)


def test_no_dual_clip_when_disabled():
    loss, _ = per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, None, name="ppo_clip")
    assert loss[1, 1].item() == pytest.approx(20.0, rel=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        per_token_policy_loss(LOGP, OLD, ADV, 0.2, 0.24, 0.5, name="ppo_clip")


def test_approx_kl_is_mean_old_minus_new():
    _, m = policy_loss(LOGP, OLD, ADV, MASK, agg=Aggregation("token-mean"), **PPO)
    expected = (-(torch.log(RATIO)) * MASK).sum() / MASK.sum()
    assert m["approx_kl"] == pytest.approx(expected.item(), abs=1e-6)


def test_gradient_is_minus_advantage_times_ratio_where_unclipped():
    logp = LOGP.clone().requires_grad_()
    loss, _ = policy_loss(logp, OLD, ADV, MASK, agg=Aggregation("token-mean"), **PPO)
    loss.backward()
    n = MASK.sum()
    expected = torch.tensor([[-1.1, 0.0, 0.0], [0.0, 0.0, 0.0]]) / n  # clipped tokens: no gradient
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)


def test_ppo_ratio_one_means_vanilla_pg():
    logp = torch.randn(3, 4).requires_grad_()
    adv = torch.randn(3, 4)
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(3, 4), agg=Aggregation("token-mean"), **PPO)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 12)
    assert math.isclose(loss.item(), -adv.mean().item(), rel_tol=1e-5, abs_tol=1e-6)


# ------------------------------------------------------------------ GSPO, CISPO, composition

from arlopti.algorithms import POLICY_LOSSES, grpo_objective  # noqa: E402
from arlopti.config import AlgorithmConfig  # noqa: E402
from arlopti.algorithms.policy_loss import cispo_loss, gspo_loss  # noqa: E402


def test_gspo_sequence_ratio_value_and_gradient_by_hand():
    # one response, 2 valid tokens, log-ratios 0.1 and -0.3: log s = -0.1, s = e^-0.1 = 0.9048
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp = (old + torch.tensor([[0.1, -0.3, 5.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([[-1.0, -1.0, 0.0]])
    s = math.exp(-0.1)
    loss, ind = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=None)  # |log s| inside the clip
    assert torch.allclose(loss[0, :2], torch.tensor([s, s]))
    assert torch.allclose(ind["ratio"][0, :2], torch.tensor([s, s]))
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    # d/dlogp_t of the token mean of -A_t * s_t = -A_t * s / 2 (token t's own log-prob only)
    assert torch.allclose(logp.grad, torch.tensor([[s / 2, s / 2, 0.0]]))


def test_gspo_clips_on_the_sequence_ratio():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.4, 0.0]], requires_grad=True)  # log s = 0.2: s = 1.221 > 1 + 4e-4
    loss, ind = gspo_loss(logp, old, torch.ones(1, 2), torch.ones(1, 2), **GSPO)
    assert torch.allclose(loss, torch.full((1, 2), -(1 + 4e-4)))
    assert ind["clip_high"].all()
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))  # clipped: no gradient, as in PPO


def _verl_gspo(old, logp, adv, mask, lo, hi):
    """verl/trainer/ppo/core_algos.py compute_policy_loss_gspo restated (the per-token loss matrix)."""
    neg_kl = logp - old
    seq = (neg_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_r = torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0)
    r = torch.exp(log_r)
    return torch.maximum(-adv * r, -adv * torch.clamp(r, 1 - lo, 1 + hi))


def test_gspo_equals_verls_formula():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=g) * 3
    logp = old + 0.01 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 6).clone()
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    ours, _ = gspo_loss(logp, old, adv, mask, **GSPO)
    assert torch.allclose(ours, _verl_gspo(old, logp, adv, mask, 3e-4, 4e-4))


def test_cispo_value_and_gradient_keep_clipped_tokens():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.1, 1.5, 0.5]])).requires_grad_()  # ratios (old = 0)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, ind = cispo_loss(logp, old, adv, None, clip_low=0.2, clip_high=0.28, dual_clip=None)
    w = torch.tensor([[1.1, 1.28, 0.8]])  # clipped weights
    assert torch.allclose(loss, -w * adv * logp.detach())
    assert ind["clip_high"].tolist() == [[False, True, False]] and ind["clip_low"].tolist() == [[False, False, True]]
    loss.sum().backward()
    assert torch.allclose(logp.grad, -w * adv)  # every token keeps a gradient (PPO would give 0 at 2 and 3)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_a_lopti_phase_leaves_the_other_phases_tokens_without_gradient(name):
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(3, 5, generator=g) * 3
    logp = (old + 0.05 * torch.randn(3, 5, generator=g)).requires_grad_()
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    adv = torch.randn(3, 1, generator=g).expand(3, 5).clone() * mask
    low = (torch.exp(old) < 0.3) & mask.bool()
    assert low.any() and (mask.bool() & ~low).any()
    cfg = AlgorithmConfig(policy_loss=name, dual_clip=10.0 if name == "ppo_clip" else None, kl_coef=0.1,
                     loss_agg="seq-mean-token-mean" if name == "gspo" else "token-mean",
                     clip_low=0.2, clip_high=0.24)
    ref = old - 0.1
    loss, _ = grpo_objective(logp, old, adv, mask, low, cfg, ref_log_probs=ref)
    loss.backward()
    high = mask.bool() & ~low
    assert torch.equal(logp.grad[high], torch.zeros(int(high.sum())))
    assert (logp.grad[low] != 0).all()


def test_the_correction_weight_multiplies_each_tokens_loss():
    w = torch.tensor([[0.5, 2.0, 1.0], [0.0, 1.0, 1.0]])
    plain, _ = policy_loss(LOGP, OLD, ADV, MASK, agg=Aggregation("token-mean"), **PPO)
    weighted, _ = policy_loss(LOGP, OLD, ADV, MASK, agg=Aggregation("token-mean"), token_weight=w, **PPO)
    assert float(weighted) == pytest.approx(float((PER_TOKEN * w * MASK).sum() / MASK.sum()))
    assert float(plain) == pytest.approx(float((PER_TOKEN * MASK).sum() / MASK.sum()))


def test_kl_in_reward_leaves_the_kl_out_of_the_loss_but_measures_it():
    logp = torch.log(torch.full((1, 2), 0.5)).requires_grad_()
    ref = torch.log(torch.full((1, 2), 0.25))
    mask = torch.ones(1, 2)
    args = (logp, logp.detach(), torch.zeros(1, 2), mask, mask)
    in_loss, m_loss = grpo_objective(*args, AlgorithmConfig(kl_coef=1.0, kl_in="loss"), ref_log_probs=ref)
    in_reward, m_reward = grpo_objective(*args, AlgorithmConfig(kl_coef=1.0, kl_in="reward"), ref_log_probs=ref)
    assert float(in_reward.detach()) == 0.0 and float(in_loss.detach()) > 0
    assert m_reward["kl"] == pytest.approx(m_loss["kl"]) and m_reward["kl"] > 0


def test_losses_without_dual_clip_refuse_one():
    with pytest.raises(ValueError, match="dual_clip=null"):
        gspo_loss(LOGP, OLD, ADV, MASK, 3e-4, 4e-4, dual_clip=10.0)


def test_unknown_loss_and_impossible_combinations_are_config_errors():
    from arlopti.config import ConfigError, RunConfig, validate_run

    assert POLICY_LOSSES.names() == ["aspo", "ce_gppo", "cispo", "dppo_kl", "dppo_tv", "gspo", "ppo_clip", "sapo",
                                     "simko"]
    cfg = RunConfig()
    cfg.algorithm.policy_loss = "grpo"
    with pytest.raises(ConfigError, match="algorithm.policy_loss='grpo': use 'aspo', 'ce_gppo', .* or 'simko'"):
        validate_run(cfg)
    cfg.algorithm.policy_loss, cfg.algorithm.dual_clip = "gspo", None
    with pytest.raises(ConfigError, match="loss_agg=token-mean cannot apply to algorithm.policy_loss=gspo"):
        validate_run(cfg)
    cfg.algorithm.policy_loss = "cispo"
    cfg.algorithm.dual_clip = 10.0
    with pytest.raises(ConfigError, match="policy_loss=cispo has no dual-clip"):
        validate_run(cfg)
    cfg.algorithm.dual_clip = None
    cfg.algorithm.rollout_correction.mode = "tis"
    cfg.rollout.return_logprobs = False
    with pytest.raises(ConfigError, match="rollout.return_logprobs=true"):
        validate_run(cfg)
