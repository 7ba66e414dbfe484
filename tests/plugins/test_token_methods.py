"""Token methods (arlopti.plugins.token_methods): hand-computed masks/weights/bounds, their
documented effect on the gradient through shaping_for and grpo_objective, edge cases, and the refused
combinations."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import grpo_objective
from arlopti.config.registries import TOKEN_METHODS
from arlopti.plugins.token_methods import effective_weight, make_context, token_shaping
from arlopti.config import AlgorithmConfig, ConfigError, LoptiConfig, RunConfig, TokenMethodConfig, validate_run
from arlopti.plugins.shaping import Forward, shaping_for

# one response of 4 valid tokens + 1 padding column (crazy values that must never matter)
LOGP = torch.tensor([[-0.5, -1.5, -0.5, -1.5, -9.0]])
ADV = torch.tensor([[3.0, 3.0, -3.0, -3.0, 50.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
# mean_P A = 0, mean_P logp = -1  ->  cov = A * (logp + 1) = [1.5, -1.5, -1.5, 1.5]


def tm(name, **kw) -> TokenMethodConfig:
    return TokenMethodConfig(name=name, **kw)


def ctx(logp=LOGP, old=None, adv=ADV, mask=MASK, phase=None, entropy=None, clip=(0.2, 0.24)):
    return make_context(logp, logp if old is None else old, adv * mask, mask, mask if phase is None else phase,
                        entropy, *clip)


def objective(lp, old, adv, mask, phase, cfg, ref_log_probs=None, entropy=None):
    """grpo_objective with the token method's shaping (arlopti.plugins.shaping), as the learner passes it."""
    shaping = shaping_for(cfg, lp, old, adv, mask, phase, Forward(entropy))
    return grpo_objective(lp, old, adv, mask, phase, cfg, ref_log_probs=ref_log_probs, entropy=entropy,
                          shaping=shaping)


def grad_of(name, logp=LOGP, old=None, adv=ADV, mask=MASK, entropy=None, **kw):
    """∂loss/∂logπ of grpo_objective with method ``name`` (no KL)."""
    lp = logp.clone().requires_grad_(True)
    algo = AlgorithmConfig(kl_coef=0.0, token_method=tm(name, **kw))
    loss, _ = objective(lp, logp if old is None else old, adv, mask, mask, algo, entropy=entropy)
    loss.backward()
    return lp.grad


def test_registry_names():
    assert TOKEN_METHODS.names() == ["archer", "clip_cov", "kl_cov", "lp_reg", "none", "reverse", "top_entropy",
                                     "tr_grpo"]


# ------------------------------------------------------------------------------------------ Clip-Cov
def test_clip_cov_detaches_the_tokens_with_covariance_inside_the_band():
    keep = token_shaping(ctx(), tm("clip_cov", cov_ratio=1.0)).keep
    # tokens 0 and 3 have cov 1.5 in (1, 5); k = 4 > 2 candidates: both detached; padding kept
    assert keep.tolist() == [[False, True, True, False, True]]


def test_clip_cov_tie_draws_one_deterministically_and_excludes_ppo_clipped_tokens():
    k1 = token_shaping(ctx(), tm("clip_cov", cov_ratio=0.25)).keep  # k = max(1, floor(0.25 * 4)) = 1 of the tied 2
    assert int((~k1).sum()) == 1 and bool((~k1)[0, 0] | (~k1)[0, 3])
    assert torch.equal(k1, token_shaping(ctx(), tm("clip_cov", cov_ratio=0.25)).keep)
    # token 0 already PPO-clipped (ratio 2 > 1.24 with A > 0): not a candidate, so token 3 is chosen
    old = LOGP.clone()
    old[0, 0] -= math.log(2.0)
    keep = token_shaping(ctx(old=old), tm("clip_cov", cov_ratio=0.25)).keep
    assert keep.tolist() == [[True, True, True, False, True]]


def test_clip_cov_zero_advantages_and_narrow_band_detach_nothing():
    assert bool(token_shaping(ctx(adv=torch.zeros_like(ADV)), tm("clip_cov", cov_ratio=1.0)).keep.all())
    assert bool(token_shaping(ctx(), tm("clip_cov", cov_ratio=1.0, clip_cov_lb=2.0)).keep.all())


def test_clip_cov_selected_tokens_have_exactly_zero_gradient():
    g = grad_of("clip_cov", cov_ratio=1.0)
    # at ratio 1 every kept token's gradient is -A_t / N (N = 4 valid tokens, the normaliser unchanged)
    assert g.tolist() == [[0.0, -0.75, 0.75, 0.0, 0.0]]


# ------------------------------------------------------------------------------------------ KL-Cov
def test_kl_cov_penalises_the_top_covariance_tokens_ties_by_position():
    coef = token_shaping(ctx(), tm("kl_cov", cov_ratio=0.25, kl_cov_coef=2.0)).abs_log_ratio_coef
    assert coef.tolist() == [[2.0, 0.0, 0.0, 0.0, 0.0]]  # the tie 1.5 / 1.5: the earlier token
    coef = token_shaping(ctx(), tm("kl_cov", cov_ratio=0.5, kl_cov_coef=2.0)).abs_log_ratio_coef
    assert coef.tolist() == [[2.0, 0.0, 0.0, 2.0, 0.0]]
    # all-zero advantages: cov == 0 everywhere, k tokens are still chosen (verl does the same)
    coef = token_shaping(ctx(adv=torch.zeros_like(ADV)), tm("kl_cov", cov_ratio=0.25)).abs_log_ratio_coef
    assert coef.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_kl_cov_adds_coef_times_abs_log_ratio_to_the_selected_tokens_gradient():
    old = LOGP.clone()
    old[0, 0] -= 0.1  # ratio e^0.1 < 1.24: not clipped; |logp - old| has gradient +1 there
    g = grad_of("kl_cov", old=old, cov_ratio=0.25, kl_cov_coef=2.0)
    expected = [(-3.0 * math.exp(0.1) + 2.0) / 4, -0.75, 0.75, 0.75, 0.0]
    assert g[0].tolist() == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------------------------------ top-entropy
ENT = torch.tensor([[0.1, 0.5, 0.5, 0.9, 99.0]])


def test_top_entropy_keeps_tokens_at_or_above_the_quantile_ties_included():
    # valid entropies sorted [0.1, 0.5, 0.5, 0.9]; rho 0.4 -> the 0.6-quantile = 0.5 (linear) -> ties kept
    keep = token_shaping(ctx(entropy=ENT), tm("top_entropy", entropy_top=0.4)).keep
    assert keep.tolist() == [[False, True, True, True, True]]
    keep = token_shaping(ctx(entropy=ENT), tm("top_entropy", entropy_top=0.25)).keep  # 0.75-q = 0.6
    assert keep.tolist() == [[False, False, False, True, True]]
    assert bool(token_shaping(ctx(entropy=ENT), tm("top_entropy", entropy_top=1.0)).keep.all())


def test_top_entropy_tokens_below_the_quantile_have_zero_gradient():
    g = grad_of("top_entropy", entropy=ENT, entropy_top=0.25)
    assert g.tolist() == [[0.0, 0.0, 0.0, 0.75, 0.0]]
    assert bool((grad_of("top_entropy", adv=torch.zeros_like(ADV), entropy=ENT) == 0).all())


def test_top_entropy_needs_entropy():
    with pytest.raises(ValueError, match="needs the per-token entropy"):
        token_shaping(ctx(), tm("top_entropy"))


# ------------------------------------------------------------------------------------------ Archer
A_ENT = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.3, 0.3, 9.0, 9.0]])
A_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])


def test_archer_bounds_and_kl_weight_follow_the_per_response_entropy_split():
    c = make_context(torch.zeros(2, 5), torch.zeros(2, 5), torch.ones(2, 5), A_MASK, A_MASK, A_ENT)
    s = token_shaping(c, tm("archer"))
    # row 0: the 0.8-quantile of [.1 .. .5] is 0.42 -> only the last token is high-entropy;
    # row 1: all valid entropies tie at 0.3 -> none is strictly above -> all low (padding ignored)
    high = [[False, False, False, False, True], [False] * 5]
    assert torch.allclose(s.clip_low, torch.tensor([[0.5 if h else 0.2 for h in row] for row in high]))
    assert torch.equal(s.clip_high, s.clip_low)
    assert s.kl_weight.tolist() == [[0.0 if h else 1.0 for h in row] for row in high]
    assert s.keep is None and s.adv_weight is None  # Archer masks nothing


def test_archer_clip_acts_per_token():
    # every token at ratio 1.3 with A > 0: the low-entropy ones pass 1 + 0.2 (clipped: zero gradient),
    # the high-entropy one stays inside 1 + 0.5 (gradient -A * 1.3 / N)
    lp = torch.zeros(1, 5)
    old = lp - math.log(1.3)
    g = grad_of("archer", logp=lp, old=old, adv=torch.ones(1, 5), mask=torch.ones(1, 5), entropy=A_ENT[:1])
    assert g[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, -1.3 / 5], abs=1e-6)


def test_archer_kl_weight_reaches_the_kl_gradient():
    lp = torch.zeros(1, 5, requires_grad=True)
    ref = torch.full((1, 5), -1.0)
    algo = AlgorithmConfig(kl_coef=1.0, kl_estimator="k1", token_method=tm("archer"))
    loss, _ = objective(lp, lp.detach(), torch.zeros(1, 5), torch.ones(1, 5), torch.ones(1, 5), algo,
                        ref_log_probs=ref, entropy=A_ENT[:1])
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.0])  # k1 gradient 1/N, 0 on high-entropy


# ------------------------------------------------------------------------------------------ TR-GRPO / reverse
def test_tr_grpo_weight_is_the_clipped_sigmoid_of_p():
    lp = torch.log(torch.tensor([[1.0, 0.5, 1e-6, 0.25]]))
    w = token_shaping(ctx(logp=lp, adv=torch.ones(1, 4), mask=torch.ones(1, 4)), tm("tr_grpo")).adv_weight
    expected = [min(1.0, max(0.0, 4 * (1 / (1 + math.exp(-p)) - 0.5))) for p in (1.0, 0.5, 1e-6, 0.25)]
    assert w[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert w[0, 0] == pytest.approx(0.9242344, abs=1e-6)
    g = grad_of("tr_grpo", logp=lp, adv=torch.ones(1, 4), mask=torch.ones(1, 4))
    assert g[0].tolist() == pytest.approx([-e / 4 for e in expected], abs=1e-6)


def test_reverse_weight_mirrors_ar():
    old = torch.log(torch.tensor([[0.25, 1.0, 0.5]]))
    c = make_context(old, old, torch.ones(1, 3), torch.ones(1, 3), torch.ones(1, 3))
    s = token_shaping(c, tm("reverse", reverse_alpha=0.3))
    assert s.adv_weight[0].tolist() == pytest.approx([0.925, 0.7, 0.85])
    assert effective_weight(c, s)[0].tolist() == pytest.approx([0.925, 0.7, 0.85])
    g = grad_of("reverse", logp=old, adv=torch.full((1, 3), 2.0), mask=torch.ones(1, 3), reverse_alpha=0.3)
    assert g[0].tolist() == pytest.approx([-2 * 0.925 / 3, -2 * 0.7 / 3, -2 * 0.85 / 3])


# ------------------------------------------------------------------------------------------ composition
def test_under_a_lopti_phase_the_method_acts_within_the_phase_and_the_other_phase_has_no_gradient():
    phase = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]])
    lp = LOGP.clone().requires_grad_(True)
    algo = AlgorithmConfig(kl_coef=0.0, token_method=tm("clip_cov", cov_ratio=1.0))
    loss, _ = objective(lp, LOGP, ADV, MASK, phase, algo)
    loss.backward()
    # population = tokens 0, 1 (A = 3, 3 -> cov 0): nothing detached; tokens 2, 3 outside the phase: 0
    assert lp.grad.tolist() == [[-0.75, -0.75, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("method", ["clip_cov", "kl_cov", "top_entropy", "archer", "tr_grpo", "reverse"])
def test_padding_never_changes_the_result(method):
    ent = torch.tensor([[0.1, 0.5, 0.7, 0.9, 0.0]])
    a = grad_of(method, entropy=ent, cov_ratio=0.5)
    crazy = LOGP.clone()
    crazy[0, 4] = -0.01
    b = grad_of(method, logp=crazy, entropy=torch.tensor([[0.1, 0.5, 0.7, 0.9, 50.0]]), cov_ratio=0.5)
    assert torch.equal(a, b) and a[0, 4] == 0


def _run(**algo) -> RunConfig:
    cfg = RunConfig()
    for k, v in algo.items():
        setattr(cfg.algorithm, k, v)
    return cfg


def test_impossible_compositions_and_out_of_range_values_are_config_errors():
    with pytest.raises(ConfigError, match="top_entropy cannot combine with algorithm.lopti.enabled=true"):
        validate_run(_run(token_method=tm("top_entropy"), lopti=LoptiConfig(enabled=True)))
    with pytest.raises(ConfigError, match="reverse cannot combine with algorithm.ar_alpha=0.3"):
        validate_run(_run(token_method=tm("reverse"), ar_alpha=0.3))
    with pytest.raises(ConfigError, match="clip_cov needs algorithm.policy_loss=ppo_clip"):
        validate_run(_run(token_method=tm("clip_cov"), policy_loss="cispo", dual_clip=None))
    with pytest.raises(ConfigError, match="archer cannot apply to algorithm.policy_loss=gspo"):
        validate_run(_run(token_method=tm("archer"), policy_loss="gspo", dual_clip=None,
                          loss_agg="seq-mean-token-mean"))
    with pytest.raises(ConfigError, match="clip_cov_lb=5.0 must be below clip_cov_ub=5.0"):
        validate_run(_run(token_method=tm("clip_cov", clip_cov_lb=5.0)))
    with pytest.raises(ConfigError, match="tr_min=2.0 must not exceed tr_max=1.0"):
        validate_run(_run(token_method=tm("tr_grpo", tr_min=2.0)))
    for bad in (dict(entropy_top=0.0), dict(entropy_top=1.5), dict(cov_ratio=0.0), dict(archer_quantile=1.0),
                dict(reverse_alpha=1.2), dict(name="clipcov")):
        with pytest.raises(ConfigError, match="algorithm.token_method." + next(iter(bad))):
            validate_run(_run(token_method=tm(**{"name": "top_entropy", **bad})))
    # what composes passes
    validate_run(_run(token_method=tm("archer"), lopti=LoptiConfig(enabled=True), ar_alpha=0.3))
    validate_run(_run(token_method=tm("kl_cov"), lopti=LoptiConfig(enabled=True)))


EXPERIMENTS = {"kk_clip_cov": "clip_cov", "kk_clip_cov_lopti": "clip_cov", "kk_kl_cov": "kl_cov",
               "kk_kl_cov_lopti": "kl_cov", "kk_top_entropy": "top_entropy", "kk_archer": "archer",
               "kk_archer_lopti": "archer", "kk_tr_grpo": "tr_grpo", "kk_tr_grpo_lopti": "tr_grpo",
               "kk_reverse": "reverse", "kk_reverse_lopti": "reverse"}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_method_experiment_composes_and_validates(name, tmp_path):
    from arlopti.config import from_dict
    from omegaconf import OmegaConf
    from helpers.compose import compose_train

    cfg = compose_train([f"experiment={name}", "debug=smoke"], tmp_path)
    algo = from_dict(AlgorithmConfig, OmegaConf.to_container(cfg.algorithm, resolve=True), "algorithm")
    assert algo.token_method.name == EXPERIMENTS[name]
    assert algo.lopti.enabled == name.endswith("_lopti")
    assert algo.ar_alpha == 0.0 and cfg.task_name == name
