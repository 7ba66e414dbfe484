"""``compare-methods``: GRPO, AR, Lopti, AR + Lopti and every token method side by side, one batch.

From the same weights θ and the same batch (``old_log_probs = log π_θ``, so every ratio is 1), for
each method:

* its **effective advantages** A'_t = c_t·A_t at θ. For a token method, c_t is
  :func:`arlopti.algorithms.token_methods.effective_weight` of its shaping computed on the whole
  batch (one "micro-batch"; entropy from the same forward): ``adv_weight · keep``. This is exact
  for the first step: at ratio 1 the gradient of :func:`~arlopti.algorithms.grpo_objective` with
  the method equals the plain GRPO gradient with A' (a per-token clip bound is inactive at ratio 1,
  KL-Cov's |logπ − logπ_old| has zero (sub)gradient there, and the analysis has no KL term).
  Consequently **Archer and KL-Cov equal GRPO on a first step from θ**: they act only off-policy
  (later mini-batches / epochs) or through the KL term, which a one-step comparison cannot show.
  AR: A' = (α·p_old + 1 − α)·A; Lopti: A on the low phase (p_old < η), then the high phase;
* ``effective_weight``: the mean c_t per bucket of p_old (the multiplier relative to GRPO; Lopti 1);
* ``mass_share``: the gradient-mass share per bucket, Σ|A'_t|·(1 − p_t) over the bucket divided by
  the total (:func:`arlopti.algorithms.buckets.grad_mass_shares`; Lopti: both phases' tokens);
* ``bucket_grad_norm``: ‖g_b‖, the global norm of that loss's gradient restricted to bucket b's
  tokens (below; the official ``mask_prob_intervalK`` norm of the method's own loss);
* ``norm_share``: the share of the first step's gradient g contributed by each bucket,
  ⟨g_b, g⟩ / ‖g‖², g_b the gradient of the same loss restricted to bucket b's tokens (the shares
  sum to 1; Lopti and AR + Lopti: of the low phase's step, so the high buckets show 0);
* after the method's update (one optimizer step per phase, a fresh optimizer from θ, as
  :mod:`.update_direction`): the Fig. 3 fractions ``pos_frac`` / ``neg_frac`` per bucket and the
  mean Δp over A > 0 / A < 0 tokens per bucket (:func:`.prob_shift.delta_p_stats`).

Buckets are by p_old; the update-direction sign is that of the GRPO advantage (no method here
flips it). Clip-Cov and KL-Cov use ``cov_ratio`` (``--cov-ratio``, default 0.02: verl's 2e-4 would
select one token of a ~10³-token batch and show nothing). A method whose first-step advantages and
phases equal an earlier method's is not recomputed: its entry copies that one's numbers and says
``same_update_as``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import Tensor

from arlopti.algorithms import advantage_reweight, lopti_masks
from arlopti.algorithms.token_methods import effective_weight, make_context, token_shaping
from arlopti.algorithms.buckets import (BUCKET_NAMES, NUM_BUCKETS, bucket_index, bucket_means, grad_mass_shares,
                                      per_bucket_dict, update_direction_counts, update_direction_fractions)
from arlopti.analysis.prob_shift import delta_p_stats
from arlopti.analysis.updates import (LossSpec, WeightSnapshot, add_gradients, apply_gradient, loss_gradients,
                                      make_optimizer, sampled_log_probs)
from arlopti.config import TokenMethodConfig

log = logging.getLogger(__name__)

BASE_METHODS = ("grpo", "ar", "lopti", "ar_lopti")
TOKEN_METHODS = ("clip_cov", "kl_cov", "top_entropy", "archer", "tr_grpo", "reverse")
METHODS = BASE_METHODS + TOKEN_METHODS


@torch.no_grad()
def sampled_entropy(policy, batch, micro_batch_size: int = 8) -> Tensor:
    """``[B, R]`` per-token entropy of π_θ at the batch's temperature (eval mode), 0 on padding."""
    from arlopti.learner.policy import batched_logprobs

    was = policy.training
    policy.eval()
    try:
        _, ent = batched_logprobs(policy, batch.input_ids, batch.attention_mask, batch.prompt_len, batch.temperature,
                                  micro_batch_size, with_entropy=True)
    finally:
        policy.train(was)
    return ent * batch.response_mask


def method_plan(name: str, old: Tensor, entropy: Tensor, adv: Tensor, mask: Tensor, alpha: float, eta: float,
                token_cfg: TokenMethodConfig) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(c, A', phases)`` of one method at θ (module docstring): the per-token multiplier c,
    the effective advantages and the token masks of its phases in order."""
    valid = mask.bool()
    low, high = lopti_masks(old, mask, eta)
    ones = torch.ones_like(adv)
    if name in ("grpo", "lopti"):
        c = ones
    elif name in ("ar", "ar_lopti"):
        c = advantage_reweight(ones, old, alpha)
    elif name in TOKEN_METHODS:
        ctx = make_context(old, old, adv * mask, mask, mask, entropy)
        c = effective_weight(ctx, token_shaping(ctx, replace(token_cfg, name=name)))
    else:
        raise ValueError(f"--methods: unknown method {name!r}; choose from {list(METHODS)}")
    phases = [low, high] if name.endswith("lopti") else [valid]
    return c * mask, adv * c, phases


def _dot(a: list[Tensor], b: list[Tensor]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


def _method_update(policy, batch, old: Tensor, adv_eff: Tensor, phases: list[Tensor], idx: Tensor, optimizer: str,
                   lr: float, micro_batch_size: int) -> dict:
    """One method's update from the current weights (module docstring): the per-bucket gradient
    norm shares of its first step, its phases' optimizer steps, then the direction and size of the
    probability changes by bucket."""
    mask, adv, p_old = batch.response_mask, batch.advantages, torch.exp(old.float())
    first = phases[0].bool()
    specs = {f"b{b}": LossSpec(adv_eff, (first & (idx == b)).float()) for b in range(NUM_BUCKETS)}
    bank = loss_gradients(policy, batch, old, specs, micro_batch_size)
    g = add_gradients(*(bank[f"b{b}"] for b in range(NUM_BUCKETS)))
    gg = _dot(g, g)
    norm_share = [(_dot(bank[f"b{b}"], g) / gg) if gg > 0 else None for b in range(NUM_BUCKETS)]
    bucket_norm = [_dot(bank[f"b{b}"], bank[f"b{b}"]) ** 0.5 for b in range(NUM_BUCKETS)]
    del bank
    opt = make_optimizer(policy, optimizer, lr)
    norms = []
    if bool(first.any()):  # like the learner, a phase without tokens takes no step
        norms.append(apply_gradient(policy, opt, g, None))
    del g
    for ph in phases[1:]:
        if bool(ph.any()):
            g2 = loss_gradients(policy, batch, old, {"p": LossSpec(adv_eff, ph.float())}, micro_batch_size)["p"]
            norms.append(apply_gradient(policy, opt, g2, None))
    new = sampled_log_probs(policy, batch, micro_batch_size)
    pos, neg = update_direction_fractions(update_direction_counts(old, new, adv, mask))
    dp = delta_p_stats(old, new, adv, mask)
    trained = torch.zeros_like(mask)
    for ph in phases:
        trained = trained + ph.float()
    return {"mass_share": per_bucket_dict(grad_mass_shares(p_old, adv_eff * trained, mask)),
            "norm_share": dict(zip(BUCKET_NAMES, norm_share)),
            "bucket_grad_norm": dict(zip(BUCKET_NAMES, bucket_norm)),
            "pos_frac": per_bucket_dict(pos), "neg_frac": per_bucket_dict(neg),
            "delta_p_pos_mean": per_bucket_dict(dp["delta_p_pos_mean"]),
            "delta_p_neg_mean": per_bucket_dict(dp["delta_p_neg_mean"]),
            "grad_norms": norms, "first_step_grad_norm": gg ** 0.5}


def compare_methods(policy, batch, methods: tuple[str, ...] = METHODS, alpha: float = 0.3, eta: float = 0.5,
                    optimizer: str = "sgd", lr: float = 1e-2, micro_batch_size: int = 4,
                    old_log_probs: Tensor | None = None, token_cfg: TokenMethodConfig | None = None) -> dict:
    """Every method's numbers (module docstring); the weights are restored afterwards."""
    token_cfg = token_cfg or TokenMethodConfig(cov_ratio=0.02)
    old = sampled_log_probs(policy, batch, micro_batch_size) if old_log_probs is None else old_log_probs
    mask, adv = batch.response_mask, batch.advantages
    ent = sampled_entropy(policy, batch, micro_batch_size) if set(methods) & {"top_entropy", "archer"} \
        else torch.zeros_like(mask)
    p_old = torch.exp(old.float())
    idx = bucket_index(p_old)
    snap = WeightSnapshot(policy)
    results, seen = {}, []
    try:
        for m in methods:
            c, adv_eff, phases = method_plan(m, old, ent, adv, mask, alpha, eta, token_cfg)
            same = next((prev for prev, a, ph in seen if torch.equal(a, adv_eff) and len(ph) == len(phases)
                         and all(torch.equal(x, y) for x, y in zip(ph, phases))), None)
            seen.append((m, adv_eff, phases))
            if same is not None:  # identical first step (e.g. Archer, KL-Cov vs GRPO): identical numbers
                results[m] = {**results[same], "effective_weight": per_bucket_dict(bucket_means(c, p_old, mask)),
                              "same_update_as": same}
                continue
            log.info("compare-methods: %s", m)
            snap.restore()
            results[m] = {"effective_weight": per_bucket_dict(bucket_means(c, p_old, mask)),
                          **_method_update(policy, batch, old, adv_eff, phases, idx, optimizer, lr, micro_batch_size)}
    finally:
        snap.restore()
    return {"optimizer": optimizer, "lr": lr, "alpha": alpha, "eta": eta,
            "token_method": {k: v for k, v in vars(token_cfg).items() if k != "name"},
            "advantage_source": batch.advantage_source, "methods": results,
            "tokens_per_bucket": per_bucket_dict(torch.stack([(idx[mask.bool()] == b).sum() for b in
                                                              range(NUM_BUCKETS)]).float())}


def markdown_table(result: dict, bucket: str = BUCKET_NAMES[-1]) -> str:
    """One row per method: the numbers of one bucket (default the highest, (.75, 1])."""
    def f(v, fmt="{:.3f}"):
        return "–" if v is None else fmt.format(v)

    lines = [f"| method | weight vs GRPO | mass share | norm share | A>0 rose | A<0 fell | mean Δp (A>0) | "
             f"mean Δp (A<0) |", "|---|---|---|---|---|---|---|---|"]
    for m, r in result["methods"].items():
        lines.append(f"| {m} | {f(r['effective_weight'][bucket])} | {f(r['mass_share'][bucket])} | "
                     f"{f(r['norm_share'][bucket])} | {f(r['pos_frac'][bucket])} | {f(r['neg_frac'][bucket])} | "
                     f"{f(r['delta_p_pos_mean'][bucket], '{:+.2e}')} | {f(r['delta_p_neg_mean'][bucket], '{:+.2e}')} |")
    return "\n".join(lines)



def plot_compare_methods(result: dict):
    """Four panels of grouped bars by bucket, one bar per method (the existing analysis style)."""
    import matplotlib.pyplot as plt

    from arlopti.analysis.plotting import caption_under, grouped_bars, bucket_values

    m = result["methods"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 8.5))
    grouped_bars(axes[0, 0], {k: bucket_values(v["pos_frac"]) for k, v in m.items()}, "fraction",
                  "A > 0 tokens whose probability rose (Fig. 3)", hline=0.5)
    grouped_bars(axes[0, 1], {k: bucket_values(v["mass_share"]) for k, v in m.items()}, "share",
                  "gradient-mass share Σ|A'|(1 − p)")
    grouped_bars(axes[1, 0], {k: bucket_values(v["delta_p_pos_mean"]) for k, v in m.items()}, "mean Δp",
                  "Δp of A > 0 tokens after the update")
    grouped_bars(axes[1, 1], {k: bucket_values(v["norm_share"]) for k, v in m.items()}, "share",
                  "share of the first step's gradient ⟨g_b, g⟩/‖g‖²")
    axes[0, 0].set_ylim(0, 1.05)
    fig.suptitle(f"Token methods on one batch ({result['optimizer'].upper()}, lr {result['lr']:g}; "
                 f"AR α={result['alpha']}, Lopti η={result['eta']})", fontsize=11)
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return fig
