"""``PolicyLM`` and the old-log-prob pass with full-distribution statistics (issue 35): the statistics of the
tiny model's response tokens equal a full-logits computation; asking for none returns what it always did;
the old pass's Σ p² (OTB) is zero on skipped rows and padding; OTB turns off the reused first forward."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.plugins.forward_needs import forward_stats, needs_old_before_update, old_pass_stats
from arlopti.config import AlgorithmConfig, TokenMethodConfig
from arlopti.learner.experience import Experience
from arlopti.learner.policy import PolicyLM, old_and_ref_log_probs
from arlopti.ops.tile_stats import StatsRequest


def _batch(tok, rows=3):
    g = torch.Generator().manual_seed(0)
    p, r = 5, 6
    ids = torch.randint(5, len(tok), (rows, p + r), generator=g)
    attn = torch.ones(rows, p + r, dtype=torch.long)
    attn[1, p + 4:] = 0  # a shorter response
    mask = attn[:, p:].float()
    return Experience(input_ids=ids, attention_mask=attn, response_mask=mask, prompt_len=p,
                      rewards=torch.zeros(rows), group_ids=torch.zeros(rows, dtype=torch.long),
                      truncated=torch.zeros(rows, dtype=torch.bool), correct=torch.zeros(rows, dtype=torch.bool))


def _full_logits(policy: PolicyLM, exp: Experience, temperature: float) -> torch.Tensor:
    hidden = policy.hf.get_decoder()(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                                     position_ids=(exp.attention_mask.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    return policy.hf.get_output_embeddings()(hidden[:, exp.prompt_len - 1:-1]).float() / temperature


def test_forward_statistics_equal_full_logits(tiny_model, tiny_tokenizer):
    policy = PolicyLM(tiny_model, "fused").eval()
    exp = _batch(tiny_tokenizer)
    req = StatsRequest(sum_p2=True, top_k=2, min_p_log=-1.0)
    with torch.no_grad():
        logp, ent, st = policy(exp.input_ids, exp.attention_mask, exp.prompt_len, 0.7, stats=req)
        plain = policy(exp.input_ids, exp.attention_mask, exp.prompt_len, 0.7)
        z = _full_logits(policy, exp, 0.7)
    assert len(plain) == 2 and torch.equal(plain[0], logp) and torch.equal(plain[1], ent)
    p = torch.softmax(z, -1)
    torch.testing.assert_close(st.sum_p2, (p ** 2).sum(-1), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(st.top_log_probs, torch.log_softmax(z, -1).topk(2, -1).values, rtol=1e-5, atol=1e-5)
    assert st.top_log_probs.shape == (3, 6, 2) and st.kept_log_mass.shape == (3, 6)


def test_the_old_pass_returns_sum_p2_only_when_asked(tiny_model, tiny_tokenizer):
    policy = PolicyLM(tiny_model, "fused")
    exp = _batch(tiny_tokenizer)
    assert len(old_and_ref_log_probs(policy, None, exp, set(), 2, 0.7)) == 2
    old, ref, st = old_and_ref_log_probs(policy, None, exp, {2}, 2, 0.7, stats=StatsRequest(sum_p2=True))
    with torch.no_grad():
        want = (torch.softmax(_full_logits(policy.eval(), exp, 0.7), -1) ** 2).sum(-1) * exp.response_mask
    want[2] = 0.0  # a skipped row (the reused first step's) gets none, as its logp_old
    assert ref is None and st.top_log_probs is None
    torch.testing.assert_close(st.sum_p2, want, rtol=1e-5, atol=1e-7)
    assert torch.all(st.sum_p2[1, 4:] == 0) and torch.all(old[2] == 0)


def test_what_each_method_asks_of_the_forward_passes():
    assert not forward_stats(AlgorithmConfig(), 0.7) and old_pass_stats(AlgorithmConfig()) is None
    assert forward_stats(AlgorithmConfig(policy_loss="simko", dual_clip=None), 0.7).top_k == 3
    lp = forward_stats(AlgorithmConfig(token_method=TokenMethodConfig(name="lp_reg", lp_reg_min_p=0.1)), 0.5)
    assert lp.min_p_log == pytest.approx(math.log(0.1) / 0.5)  # Lp-Reg filters the raw logits: log k / T
    assert old_pass_stats(AlgorithmConfig(advantage="otb")) == StatsRequest(sum_p2=True)
    assert needs_old_before_update(AlgorithmConfig(advantage="otb"))
    assert needs_old_before_update(AlgorithmConfig(kl_in="reward", kl_coef=0.1))
    assert not needs_old_before_update(AlgorithmConfig(kl_in="reward", kl_coef=0.0))
