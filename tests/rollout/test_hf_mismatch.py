"""The HF engine's sampling log-probs equal the trainer's logπ_old in fp32 (no rollout/trainer mismatch).

``rollout=hf`` samples with ``generate`` on the live policy (KV-cached, one position at a time) and
records log_softmax(logits / T) of each sampled token; the learner recomputes logπ_old with one
full forward (:func:`arlopti.learner.policy.fill_logprobs`, as ``GRPOModule._log_probs`` does).
Same weights, same fp32, same temperature: they differ only in float summation order (cached vs
full attention): measured mean 2.5e-7, max 1.4e-6 over 384 tokens (this test, 2-core CPU). The
bound is 1e-5, 7x above that; one optimizer step moves log-probs by orders of magnitude more
(tests/rollout/test_vllm.py measured a mean 0.31 after one skipped sync).

The final norm is scaled ×4 so that the random model's p spreads over all four probability buckets
(uniform-ish p ≈ 1/V would put every token in b0) and the per-bucket metrics see real data.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.rollout.engine import SamplingConfig

TOL = 1e-5
TEXTS = ["Zoey said that", "Knights always tell the truth, and", "The answer is", "So who is a knight"]


@pytest.fixture(scope="module")
def policy_and_tok():
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer

    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    policy = PolicyLM(build_tiny_model(tok))
    with torch.no_grad():
        policy.hf.model.norm.weight.mul_(4.0)
    return policy, tok


def rollout(policy, tok, sampling: SamplingConfig):
    """(trainer logπ_old, engine log-probs, response mask) of 4 prompts × 4 samples."""
    from arlopti.learner.experience import build_experience
    from arlopti.learner.policy import fill_logprobs
    from arlopti.rollout.hf import HFEngine
    from arlopti.tasks.base import RewardResult

    prompts = [tok(t)["input_ids"] for t in TEXTS]
    comps = HFEngine(policy, tok).generate(prompts, 4, sampling)
    results = [RewardResult(0.0, False, {}) for cs in comps for _ in cs]
    exp = build_experience(prompts, comps, results, pad_id=tok.pad_token_id)
    assert exp.engine_logprobs is not None, "the HF engine returned no log-probs with logprobs=True"
    old = torch.zeros_like(exp.response_mask)
    policy.eval()
    fill_logprobs(policy, exp, list(range(len(exp))), old, chunk_rows=4, temperature=sampling.temperature)
    return old * exp.response_mask, exp.engine_logprobs, exp.response_mask


def test_hf_engine_logprobs_equal_the_trainers_in_fp32(policy_and_tok, capsys):
    from arlopti.plugins.mismatch import correction_weights
    from arlopti.plugins.buckets import BUCKET_NAMES
    from arlopti.config import RolloutCorrectionConfig
    from arlopti.learner.mismatch_metrics import add_mismatch_metrics
    from arlopti.learner.metric_set import MetricSet

    policy, tok = policy_and_tok
    old, engine, mask = rollout(policy, tok, SamplingConfig(temperature=0.7, max_new_tokens=24, seed=3,
                                                            logprobs=True))
    gap = (old - engine).abs()[mask.bool()]
    ms = MetricSet()
    add_mismatch_metrics(ms, old, engine, mask)
    m = ms.as_dict()
    with capsys.disabled():
        print(f"\n[hf fp32 T=0.7] |trainer - engine| over {gap.numel()} tokens: mean {gap.mean():.2e} "
              f"max {gap.max():.2e}; tokens per bucket "
              f"{[int(m[f'mismatch/tokens/{b}']) for b in BUCKET_NAMES]}")
    assert gap.numel() > 100
    assert gap.max() < TOL
    assert m["mismatch/abs_diff_max"] < TOL and m["mismatch/ratio_outside_frac"] == 0.0
    assert 0.0 <= m["mismatch/k3_kl"] < TOL ** 2
    assert sum(m[f"mismatch/tokens/{b}"] > 0 for b in BUCKET_NAMES) >= 3, "the scaled model should spread p"
    for mode in ("tis", "mis", "seq_tis"):
        rc = RolloutCorrectionConfig(mode=mode)
        w = correction_weights(old, engine, mask, rc.mode, rc.cap, rc.mis_low, rc.mis_high)[mask.bool()]
        assert torch.allclose(w, torch.ones_like(w), atol=1e-3), mode


def test_top_p_makes_the_engine_logprobs_renormalised(policy_and_tok):
    """With top_p < 1 the engine reports log-probs renormalised over the nucleus: log π_engine =
    log π_trainer − log(kept mass) ≥ log π_trainer, so d = old − engine ≤ 0, < 0 where the nucleus
    dropped tokens. A mismatch by design, which the metrics show (documented in docs/metrics.md)."""
    policy, tok = policy_and_tok
    sampling = SamplingConfig(temperature=1.0, top_p=0.8, max_new_tokens=16, seed=4, logprobs=True)
    old, engine, mask = rollout(policy, tok, sampling)
    d = (old - engine)[mask.bool()]
    assert d.max() < TOL
    assert d.min() < -0.01 and math.isfinite(float(d.min()))
