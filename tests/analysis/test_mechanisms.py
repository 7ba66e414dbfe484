"""The paper's mechanism claims, checked on SmolLM2-135M-Instruct (offline) with sampled K&K rollouts.

One model load and one sampled batch (2 prompts x 4 responses x 48 tokens at T = 0.7, the raw
model, so the K&K rewards barely vary and the advantages are the labelled synthetic ±1 per
sequence) are shared by every test of this file. What is asserted is what must hold exactly or
robustly; the measured numbers (gradient-norm ratio, update-direction fractions) are printed
(run with ``-s``) rather than asserted, except the strict low-vs-high median inequality.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.algorithms import advantage_reweight, ar_weights, grpo_objective, lopti_masks, phase_plan
from arlopti.config import AlgorithmConfig
from arlopti.plugins.buckets import BUCKET_NAMES, bucket_index
from arlopti.analysis.grad_norms import per_token_grad_norms, summarise_per_token
from arlopti.learner.policy import position_ids_from_mask

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def smol(smollm2_path):
    """(loaded policy, batch, old log-probs): one SmolLM2 load and one sample for the whole module."""
    from arlopti.analysis.inputs import load_policy, sample_kk_batch
    from arlopti.analysis.updates import sampled_log_probs

    loaded = load_policy("smollm2-135m-instruct", cold_start_steps=0)
    batch = sample_kk_batch(loaded, num_prompts=2, group_size=4, max_new_tokens=48, temperature=TEMPERATURE,
                            seed=0, num_people=[2, 3], puzzle_seed=4242)
    old = sampled_log_probs(loaded.policy, batch, micro_batch_size=8)
    return loaded, batch, old


@pytest.fixture(scope="module")
def token_records(smol):
    loaded, batch, old = smol
    return per_token_grad_norms(loaded.policy, batch, old, max_tokens=16, max_sequences=4, seed=0)


def _tempered_logits(policy, batch, rows):
    """Leaf tensor z [n, R, V] of the response positions' tempered logits (no backbone graph)."""
    with torch.no_grad():
        ids, attn = batch.input_ids[rows], batch.attention_mask[rows]
        h = policy.hf.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                                    use_cache=False).last_hidden_state[:, batch.prompt_len - 1:-1]
        z = policy.hf.get_output_embeddings()(h).float() / batch.temperature
    return z.requires_grad_(True), batch.input_ids[rows, batch.prompt_len:]


def _logp(z, targets):
    return torch.log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def test_batch_spreads_over_all_buckets(smol):
    _, batch, old = smol
    b = bucket_index(old.exp())[batch.response_mask.bool()]
    counts = torch.bincount(b, minlength=4).tolist()
    print("\ntokens per bucket:", dict(zip(BUCKET_NAMES, counts)), "advantages:", batch.advantage_source)
    assert all(c > 0 for c in counts)


def test_logit_gradient_is_onehot_minus_p_with_the_exact_norm_and_bounds(token_records):
    assert len(token_records) == 16
    for r in token_records:
        assert r["logit_max_err"] < 5e-5, r  # fp32 softmax of SmolLM2: 1.05e-5 seen on AVX2
        assert r["logit_other_rows_max"] == 0.0
        assert abs(r["logit_norm"] - r["logit_formula"]) < 1e-5
        one_minus_p = r["one_minus_p"]
        assert one_minus_p - 1e-5 <= r["logit_norm"] <= math.sqrt(2) * one_minus_p + 1e-5


def test_parameter_gradient_norm_is_larger_for_low_probability_tokens(token_records):
    s = summarise_per_token(token_records, layer=15)
    med = s["median"]["param_norm"]
    print("\nmedian param grad norm per bucket:", med, "ratio b0/b3:", s["ratio_lowest_to_highest_bucket"],
          "monotone:", s["monotone_decreasing"], "per bucket:", s["tokens_per_bucket"])
    assert all(v >= 3 for v in s["tokens_per_bucket"].values())
    assert med[BUCKET_NAMES[0]] > med[BUCKET_NAMES[3]]


def test_live_diagnostics_on_smollm2_match_a_direct_computation(smol):
    from arlopti.callbacks.diagnostics import TokenDiagnosticsCallback
    from arlopti.config import AlgorithmConfig, RunConfig, SizesConfig
    from arlopti.learner.module import StepContext

    loaded, batch, old = smol
    alpha, eta = 0.3, 0.5
    mask = batch.response_mask
    adv_raw = batch.advantages
    adv = advantage_reweight(adv_raw, old, alpha)
    ctx = StepContext(batch.to_experience(), old, adv_raw, adv, phase_plan(mask, old, eta), {})

    class Logger:
        calls = []

        def log_metrics(self, metrics, step=None):
            self.calls.append((step, metrics))

    logger = Logger()
    module = type("M", (), {})()
    module.last_step_context, module.rollout_step, module.policy = ctx, 1, loaded.policy
    module.temperature, module.device = batch.temperature, torch.device("cpu")
    module.cfg = RunConfig(algorithm=AlgorithmConfig(ar_alpha=alpha), sizes=SizesConfig(logprob_micro_batch_size=8))
    trainer = type("T", (), {"world_size": 1, "is_global_zero": True, "loggers": [logger], "precision_plugin": None})()
    TokenDiagnosticsCallback(every_n_steps=1, update_direction_every_n_steps=1).on_train_batch_end(
        trainer, module, None, None, 0)
    (step, m), = logger.calls
    assert step == 1
    frac = [m[f"diag/bucket_frac/{b}"] for b in BUCKET_NAMES]
    assert sum(frac) == pytest.approx(1.0, abs=1e-12)
    # direct: loop over every valid token
    p = old.exp()
    mass, count = [0.0] * 4, [0] * 4
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            if mask[i, j]:
                pv = float(p[i, j])
                b = 0 if pv <= 0.25 else 1 if pv <= 0.5 else 2 if pv <= 0.75 else 3
                mass[b] += abs(float(adv[i, j])) * (1 - pv)
                count[b] += 1
    assert frac == pytest.approx([c / sum(count) for c in count], rel=1e-9)
    shares = [m[f"diag/grad_mass_share/{b}"] for b in BUCKET_NAMES]
    assert shares == pytest.approx([x / sum(mass) for x in mass], rel=1e-5)
    w = ar_weights(old, alpha)
    for b in range(4):
        sel = mask.bool() & (bucket_index(p) == b)
        assert m[f"diag/ar_weight/{BUCKET_NAMES[b]}"] == pytest.approx(float(w[sel].double().mean()), rel=1e-6)
    # weights unchanged since old_log_probs: the post-update forward reproduces them bit for bit,
    # so no token counts as having moved in either direction
    for b in BUCKET_NAMES:
        assert m.get(f"diag/update_dir_pos/{b}", 0.0) == 0.0 and m.get(f"diag/update_dir_neg/{b}", 0.0) == 0.0
    print("\nbucket fractions:", dict(zip(BUCKET_NAMES, frac)), "grad-mass shares:", dict(zip(BUCKET_NAMES, shares)))


def _first_rows_logits(smol, n: int = 4):
    """The first ``n`` responses: (sub-batch, tempered logits z with grad, targets, mask, old log-probs)."""
    loaded, batch, old = smol
    rows = list(range(n))
    sub = batch.select(rows)
    z, targets = _tempered_logits(loaded.policy, sub, rows=list(range(n)))
    return sub, z, targets, sub.response_mask, old[rows, :sub.response_mask.shape[1]]


def test_ar_scales_each_tokens_logit_gradient_by_its_weight(smol):
    sub, z, targets, mask, o = _first_rows_logits(smol)
    adv = sub.advantages
    cfg = AlgorithmConfig(kl_coef=0.0)
    grads = {}
    for name, a in (("grpo", adv), ("ar", advantage_reweight(adv, o, 0.3))):
        loss, _ = grpo_objective(_logp(z, targets), o, a, mask, mask, cfg)
        grads[name], = torch.autograd.grad(loss, z)
    w = (0.3 * o.exp() + 0.7).unsqueeze(-1)
    torch.testing.assert_close(grads["ar"], w * grads["grpo"], rtol=1e-5, atol=1e-9)
    assert grads["grpo"].abs().sum() > 0


def test_lopti_phase_one_gives_high_tokens_zero_gradient(smol):
    sub, z, targets, mask, o = _first_rows_logits(smol)
    low, high = lopti_masks(o, mask, 0.5)
    assert low.any() and high.any()
    logp = _logp(z, targets)
    ref = logp.detach() + 0.3  # a reference that differs, so the (masked) KL term has a gradient too
    loss, _ = grpo_objective(logp, o, sub.advantages, mask, low, AlgorithmConfig(kl_coef=0.1), ref_log_probs=ref)
    g, = torch.autograd.grad(loss, z)
    per_token = g.abs().sum(-1)
    assert float(per_token[high].max()) == 0.0
    live = low & (sub.advantages != 0)
    assert bool((per_token[live] > 0).all())


def test_update_direction_runs_for_grpo_ar_and_lopti(smol):
    from arlopti.analysis.update_direction import update_direction

    loaded, batch, _ = smol
    # two responses, one of each advantage sign (the synthetic signs are ±1 per sequence), to keep it quick
    pos = next(i for i in range(len(batch)) if batch.seq_advantages[i] > 0)
    neg = next(i for i in range(len(batch)) if batch.seq_advantages[i] < 0)
    sub = batch.select(sorted([pos, neg]))
    before = [p.detach().clone() for p in loaded.policy.parameters()][:3]
    res = update_direction(loaded.policy, sub, ("grpo", "ar", "lopti"), alpha=0.3, eta=0.5, optimizer="sgd",
                           lr=0.05, micro_batch_size=4)
    for m in ("grpo", "ar", "lopti"):
        fr = res["methods"][m]
        print(f"\n{m}: pos {fr['pos_frac']}\n{' ' * len(m)}  neg {fr['neg_frac']}")
        for v in list(fr["pos_frac"].values()) + list(fr["neg_frac"].values()):
            assert v is None or 0.0 <= v <= 1.0
    assert res["lopti_low_tokens"] > 0 and res["lopti_high_tokens"] > 0
    assert res["methods"]["lopti"]["optimizer_steps"] == 2 and res["methods"]["grpo"]["optimizer_steps"] == 1
    after = [p.detach() for p in loaded.policy.parameters()][:3]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "weights must be restored"
