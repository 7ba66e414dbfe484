"""Fraction of tokens updated in the advantage's direction, by probability bucket (paper Fig. 3).

From the same weights θ and the same batch, one update per method, each from θ with a fresh
optimizer of the same kind and learning rate:

* ``grpo``: one step on the GRPO loss over all tokens;
* ``ar``: one step with the AR advantages (α·p_old + 1 − α)·A (:func:`advantage_reweight`);
* ``lopti``: the learner's two phases in order with one optimizer: a step on the tokens with
  p_old < η, then, from the weights it produced, a step on the others (the ratio still measured
  against the rollout-time log-probs, so PPO clipping can act in phase 2, as in training); a
  phase without tokens takes no step, as in the learner;
* ``ar_lopti`` (optional): Lopti with AR advantages.

Each phase is one optimizer step on the whole batch (a single mini-batch). After the method's
last step the batch's log-probs are recomputed and compared with the rollout-time ones:
``pos`` = among tokens with A > 0, the fraction whose probability rose; ``neg`` = among tokens
with A < 0, the fraction whose probability fell (the sign is that of the GRPO advantage; AR never
flips it). Buckets are by p_old.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.algorithms import advantage_reweight, lopti_masks
from arlopti.plugins.buckets import (per_bucket_dict, safe_ratio, update_direction_counts,
                                     update_direction_fractions)
from arlopti.analysis.updates import (LossSpec, WeightSnapshot, apply_gradient, loss_gradients, make_optimizer,
                                      sampled_log_probs)

METHODS = ("grpo", "ar", "lopti", "ar_lopti")


def first_step_specs(old_log_probs: Tensor, batch, methods: tuple[str, ...], alpha: float, eta: float
                     ) -> dict[str, LossSpec]:
    """The loss specs of every method's first step at θ (Lopti: its low phase)."""
    mask = batch.response_mask
    adv = batch.advantages
    adv_ar = advantage_reweight(adv, old_log_probs, alpha)
    low, _ = lopti_masks(old_log_probs, mask, eta)
    table = {"grpo": LossSpec(adv, mask), "ar": LossSpec(adv_ar, mask),
             "lopti": LossSpec(adv, low.float()), "ar_lopti": LossSpec(adv_ar, low.float())}
    unknown = [m for m in methods if m not in table]
    if unknown:
        raise ValueError(f"--methods {unknown}: choose from {list(METHODS)}")
    return {m: table[m] for m in methods}


def update_direction(policy, batch, methods: tuple[str, ...], alpha: float, eta: float, optimizer: str = "sgd",
                     lr: float = 1e-3, grad_clip: float | None = None,
                     micro_batch_size: int = 4, old_log_probs: Tensor | None = None,
                     first_grads: dict[str, list[Tensor]] | None = None) -> dict:
    """Run every method's update from θ (module docstring); the weights are restored afterwards.

    ``first_grads``: precomputed first-step gradients keyed by method (as :func:`loss_gradients`
    of :func:`first_step_specs` returns them); missing ones are computed.
    """
    old = sampled_log_probs(policy, batch, micro_batch_size) if old_log_probs is None else old_log_probs
    mask = batch.response_mask
    specs = first_step_specs(old, batch, tuple(methods), alpha, eta)
    grads = dict(first_grads or {})
    todo = {m: s for m, s in specs.items() if m not in grads}
    if todo:
        grads.update(loss_gradients(policy, batch, old, todo, micro_batch_size))
    _, high = lopti_masks(old, mask, eta)
    snap = WeightSnapshot(policy)
    results = {}
    try:
        for m in methods:
            snap.restore()
            opt = make_optimizer(policy, optimizer, lr)
            lopti = m in ("lopti", "ar_lopti")
            norms = []
            # like the learner, a phase without tokens takes no optimizer step at all
            if not lopti or bool(specs[m].phase_mask.bool().any()):
                norms.append(apply_gradient(policy, opt, grads[m], grad_clip))
            if lopti and bool(high.any()):
                spec2 = LossSpec(specs[m].advantages, high.float())
                g2 = loss_gradients(policy, batch, old, {"high": spec2}, micro_batch_size)["high"]
                norms.append(apply_gradient(policy, opt, g2, grad_clip))
            new = sampled_log_probs(policy, batch, micro_batch_size)
            counts = update_direction_counts(old, new, batch.advantages, mask)
            pos, neg = update_direction_fractions(counts)
            results[m] = {"pos_frac": per_bucket_dict(pos), "neg_frac": per_bucket_dict(neg),
                          "pos_tokens": per_bucket_dict(counts["pos_total"]),
                          "neg_tokens": per_bucket_dict(counts["neg_total"]),
                          "pos_unchanged_frac": per_bucket_dict(safe_ratio(counts["pos_same"], counts["pos_total"])),
                          "neg_unchanged_frac": per_bucket_dict(safe_ratio(counts["neg_same"], counts["neg_total"])), "grad_norms": norms, "optimizer_steps": len(norms)}
    finally:
        snap.restore()
    return {"optimizer": optimizer, "lr": lr, "grad_clip": grad_clip, "alpha": alpha, "eta": eta,
            "advantage_source": batch.advantage_source, "methods": results,
            "lopti_low_tokens": int((old.exp() < eta).logical_and(mask.bool()).sum()),
            "lopti_high_tokens": int(high.sum())}
