"""Δp by probability bucket after one update (paper Fig. 1c, 1e, 1f).

From weights θ and one batch, three separate one-step updates (each from θ, with a fresh
optimizer): the GRPO loss with the advantages kept on

* ``all``: every valid token (Fig. 1c);
* ``low``: only the tokens of bucket [0, .25] (Fig. 1e; the official ``mask_prob_interval1``);
* ``high``: only the tokens of bucket (.75, 1] (Fig. 1f; ``mask_prob_interval4``),

each normalised by all valid tokens (see :mod:`arlopti.analysis.updates`). After the step the
batch's log-probs are recomputed (no grad, rollout temperature) and, per token,
Δp = π_new(o_t) − π_old(o_t). Reported per bucket of p_old: the mean Δp over positive-advantage
tokens, over negative-advantage tokens, and the mean |Δp| over all valid tokens; plus, per
variant, the Pearson correlation over tokens of its Δp with the ``all`` variant's Δp and the
ratio of its mean |Δp| to ``all``'s ("nearly the same Δp as all tokens" means both near 1).

The update is plain SGD by default (the paper: SGD, lr 1e-3, on Qwen2.5-7B); the learning rate
must be large enough for Δp to stand out of float noise on the model at hand, so it is reported
with every result. No gradient clipping unless ``grad_clip`` is given (clipping rescales the
small ``high`` gradient up and would hide the effect being measured).
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.plugins.buckets import NUM_BUCKETS, bucket_means, bucket_sums, per_bucket_dict, safe_ratio
from arlopti.analysis.updates import (WeightSnapshot, add_gradients, apply_gradient, bucket_specs, grad_norm,
                                      loss_gradients, make_optimizer, sampled_log_probs)

VARIANTS = ("all", "low", "high")


def _pearson(a: Tensor, b: Tensor) -> float | None:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else None


def delta_p_stats(old_log_probs: Tensor, new_log_probs: Tensor, advantages: Tensor, mask: Tensor) -> dict:
    """Per-bucket Δp statistics of one update (module docstring) and the per-token Δp of valid tokens."""
    p_old = torch.exp(old_log_probs.float())
    dp = torch.exp(new_log_probs.float()) - p_old
    pos, neg = mask * (advantages > 0).float(), mask * (advantages < 0).float()
    return {
        "delta_p_pos_mean": bucket_means(dp, p_old, pos),
        "delta_p_neg_mean": bucket_means(dp, p_old, neg),
        "abs_delta_p_mean": bucket_means(dp.abs(), p_old, mask),
        "pos_tokens": bucket_sums(torch.ones_like(dp), p_old, pos),
        "neg_tokens": bucket_sums(torch.ones_like(dp), p_old, neg),
        "delta_p": dp[mask.bool()],
    }


def prob_shift(policy, batch, optimizer: str = "sgd", lr: float = 1e-3, grad_clip: float | None = None,
               micro_batch_size: int = 4, old_log_probs: Tensor | None = None,
               bank: dict[str, list[Tensor]] | None = None) -> dict:
    """Run the three one-step updates (module docstring); the weights are restored afterwards.

    ``bank``: precomputed bucket gradients ``b0`` … ``b3`` at θ (from :func:`loss_gradients` with
    :func:`bucket_specs`), reused instead of recomputed; ``all`` is their sum.
    """
    old = sampled_log_probs(policy, batch, micro_batch_size) if old_log_probs is None else old_log_probs
    adv = batch.advantages
    if bank is None or not all(f"b{b}" in bank for b in range(NUM_BUCKETS)):
        bank = loss_gradients(policy, batch, old, bucket_specs(old, batch.response_mask, adv), micro_batch_size)
    grads = {"all": add_gradients(*(bank[f"b{b}"] for b in range(NUM_BUCKETS))),
             "low": bank["b0"], "high": bank[f"b{NUM_BUCKETS - 1}"]}
    snap = WeightSnapshot(policy)
    raw: dict[str, dict] = {}
    try:
        for name in VARIANTS:
            snap.restore()
            opt = make_optimizer(policy, optimizer, lr)
            norm = apply_gradient(policy, opt, grads[name], grad_clip)
            new = sampled_log_probs(policy, batch, micro_batch_size)
            raw[name] = delta_p_stats(old, new, adv, batch.response_mask)
            raw[name]["grad_norm"] = norm
    finally:
        snap.restore()
    out = {"optimizer": optimizer, "lr": lr, "grad_clip": grad_clip,
           "advantage_source": batch.advantage_source, "variants": {}}
    base = raw["all"]
    for name in VARIANTS:
        r = raw[name]
        out["variants"][name] = {
            "grad_norm": r["grad_norm"],
            "delta_p_pos_mean": per_bucket_dict(r["delta_p_pos_mean"]),
            "delta_p_neg_mean": per_bucket_dict(r["delta_p_neg_mean"]),
            "abs_delta_p_mean": per_bucket_dict(r["abs_delta_p_mean"]),
            "pos_tokens": per_bucket_dict(r["pos_tokens"]),
            "neg_tokens": per_bucket_dict(r["neg_tokens"]),
            "abs_delta_p_ratio_to_all": per_bucket_dict(safe_ratio(r["abs_delta_p_mean"], base["abs_delta_p_mean"])),
            "corr_with_all": _pearson(r["delta_p"], base["delta_p"]),
            "abs_delta_p_overall": float(r["delta_p"].abs().mean()) if r["delta_p"].numel() else None,
        }
    return out
