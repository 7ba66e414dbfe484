"""Gradient norms by token probability (paper Fig. 1d and its bound), two ways.

**Per-token mode** (:func:`per_token_grad_norms`). For up to ``max_tokens`` sampled tokens, drawn
stratified over the four probability buckets from at most ``max_sequences`` responses, one backward
pass each of ``log π(o_t)`` (at the rollout temperature T) gives, for that single token:

* ``param_norm``: ‖∂ log π(o_t) / ∂θ‖ over all trainable parameters;
* ``hidden_norm``: ‖∂ log π(o_t) / ∂h_k‖ with h_k the residual stream after decoder layer ``k``
  (HF ``hidden_states[k]``: 0 = embeddings, L = after the final norm), the whole ``[P + R, H]``
  tensor, i.e. every position;
* ``logit_norm``: ‖∂ log π(o_t) / ∂z‖ with z the tempered logits (logits / T) at that position;
  ``logit_formula`` is the closed form sqrt((1 − p)² + Σ_{j≠t} p_j²) from p = softmax(z), and
  ``logit_max_err`` is max_v |∂ log π/∂z_v − (onehot_t − p)_v|, the check of the identity
  ∂ log p_t / ∂z = onehot_t − p.

The paper's bound: every such norm is at most a constant times (1 − p); at the logits the norm lies
in [(1 − p), √2 (1 − p)] exactly. ``p`` (``p_step``) is recomputed in the token's own forward pass
(one sequence, no padding); the bucket comes from p_old of the batched pass, like every other
analysis (the two agree to float rounding).

**Aggregate mode** (:func:`aggregate_grad_norms`, the official procedure): for each bucket, the
GRPO loss with the advantage kept only on that bucket's tokens (``mask_prob_intervalK``),
normalised by all valid tokens, and the global norm of its parameter gradient (what the official
run logs as ``actor/grad_norm``). That norm also grows with the bucket's token count and the
alignment of its tokens' gradients, so it is reported with the counts.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import Tensor

from arlopti.plugins.buckets import (BUCKET_NAMES, NUM_BUCKETS, bucket_counts, bucket_index,
                                     is_monotone_decreasing, per_bucket_dict, stratified_token_sample)
from arlopti.analysis.updates import bucket_specs, grad_norm, loss_gradients, trainable
from arlopti.learner.policy import position_ids_from_mask


def default_layer(policy) -> int:
    """The middle decoder layer, ``num_hidden_layers // 2``."""
    return int(policy.hf.config.num_hidden_layers) // 2


def choose_rows(batch, max_sequences: int, seed: int) -> list[int]:
    """Up to ``max_sequences`` rows with at least one response token, in a seeded random order."""
    gen = torch.Generator().manual_seed(seed)
    rows = [int(i) for i in torch.randperm(len(batch), generator=gen) if batch.response_mask[int(i)].sum() > 0]
    return sorted(rows[:max_sequences])


def per_token_grad_norms(policy, batch, old_log_probs: Tensor, max_tokens: int = 200, max_sequences: int = 8,
                         layer: int | None = None, seed: int = 0) -> list[dict]:
    """One record per analysed token (module docstring); sorted by (row, col)."""
    layer = default_layer(policy) if layer is None else layer
    n_layers = int(policy.hf.config.num_hidden_layers)
    if not 0 <= layer <= n_layers:
        raise ValueError(f"--layer {layer}: the model has hidden states 0..{n_layers}")
    rows = choose_rows(batch, max_sequences, seed)
    sub = torch.zeros_like(batch.response_mask)
    sub[rows] = batch.response_mask[rows]
    p_old = torch.exp(old_log_probs.float())
    picks = stratified_token_sample(p_old, sub, max_tokens, torch.Generator().manual_seed(seed + 1))
    by_row: dict[int, list[int]] = {}
    for r, c in picks:
        by_row.setdefault(r, []).append(c)
    hf = policy.hf
    backbone, head = hf.get_decoder(), hf.get_output_embeddings()
    params = trainable(policy)
    P, T = batch.prompt_len, batch.temperature
    records = []
    was = policy.training
    policy.eval()
    try:
        for row, cols in sorted(by_row.items()):
            r = int(batch.response_mask[row].sum())
            ids = batch.input_ids[row:row + 1, :P + r]
            attn = batch.attention_mask[row:row + 1, :P + r]
            with torch.enable_grad():
                out = backbone(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                               output_hidden_states=True, use_cache=False)
                h_k = out.hidden_states[layer]
                pos = torch.tensor(cols)
                z = head(out.last_hidden_state[0, P - 1 + pos]).float() / T  # [k, V] tempered logits
                targets = ids[0, P + pos]
                logp = torch.log_softmax(z, -1).gather(-1, targets[:, None]).squeeze(-1)
                for j, col in enumerate(cols):
                    g_z, g_h, *g_params = torch.autograd.grad(logp[j], [z, h_k, *params],
                                                              retain_graph=j < len(cols) - 1, allow_unused=True)
                    probs = torch.softmax(z[j].detach().double(), -1)
                    p_t = float(probs[targets[j]])
                    onehot = torch.zeros_like(probs)
                    onehot[targets[j]] = 1.0
                    others = float((probs ** 2).sum()) - p_t ** 2
                    g_params = [g for g in g_params if g is not None]
                    records.append({
                        "row": row, "col": col, "token_id": int(targets[j]),
                        "p_old": float(p_old[row, col]), "bucket": int(bucket_index(p_old[row, col:col + 1])[0]),
                        "p_step": p_t, "one_minus_p": 1.0 - p_t,
                        "logit_norm": float(g_z[j].double().norm()),
                        "logit_formula": math.sqrt(max(0.0, (1.0 - p_t) ** 2 + others)),
                        "logit_max_err": float((g_z[j].double() - (onehot - probs)).abs().max()),
                        # other positions' logits do not enter log p_t: their gradient must be 0
                        "logit_other_rows_max": (float(torch.cat([g_z[:j], g_z[j + 1:]]).abs().max())
                                                 if len(cols) > 1 else 0.0),
                        "hidden_norm": float(g_h.double().norm()) if g_h is not None else 0.0,
                        "param_norm": grad_norm(g_params),
                    })
    finally:
        policy.train(was)
    return records


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarise_per_token(records: list[dict], layer: int) -> dict:
    """Per-bucket medians, the low/high ratio, monotonicity, and the bound checks."""
    by_b = {b: [r for r in records if r["bucket"] == b] for b in range(NUM_BUCKETS)}
    med = {key: [_median([r[key] for r in by_b[b]]) for b in range(NUM_BUCKETS)]
           for key in ("param_norm", "hidden_norm", "logit_norm", "one_minus_p")}
    ratio = {}
    for key in ("param_norm", "hidden_norm", "logit_norm"):
        lo, hi = med[key][0], med[key][-1]
        ratio[key] = lo / hi if lo is not None and hi else None
    scaled = {key: [r[key] / r["one_minus_p"] for r in records if r["one_minus_p"] > 1e-6]
              for key in ("param_norm", "hidden_norm", "logit_norm")}
    eps = 1e-5
    in_bounds = [r["one_minus_p"] - eps <= r["logit_norm"] <= math.sqrt(2) * r["one_minus_p"] + eps for r in records]
    return {
        "tokens": len(records), "layer": layer,
        "tokens_per_bucket": per_bucket_dict([float(len(by_b[b])) for b in range(NUM_BUCKETS)]),
        "median": {k: per_bucket_dict(v) for k, v in med.items()},
        "ratio_lowest_to_highest_bucket": ratio,
        "monotone_decreasing": {k: is_monotone_decreasing(med[k]) for k in ("param_norm", "hidden_norm", "logit_norm")},
        "norm_over_one_minus_p_max": {k: (max(v) if v else None) for k, v in scaled.items()},
        "norm_over_one_minus_p_median": {k: _median(v) for k, v in scaled.items()},
        "logit_identity_max_err": max((r["logit_max_err"] for r in records), default=None),
        "logit_formula_max_abs_diff": max((abs(r["logit_norm"] - r["logit_formula"]) for r in records), default=None),
        "logit_norm_within_bounds_frac": (sum(in_bounds) / len(in_bounds)) if in_bounds else None,
    }


def aggregate_grad_norms(policy, batch, old_log_probs: Tensor, micro_batch_size: int = 4,
                         bank: dict[str, list[Tensor]] | None = None) -> dict:
    """Per-bucket gradient norm of the bucket-masked GRPO loss (module docstring).

    ``bank``: precomputed :func:`loss_gradients` holding ``b0`` … ``b3`` (reused, not recomputed).
    """
    adv = batch.advantages
    if bank is None or not all(f"b{b}" in bank for b in range(NUM_BUCKETS)):
        bank = loss_gradients(policy, batch, old_log_probs,
                              bucket_specs(old_log_probs, batch.response_mask, adv), micro_batch_size)
    p = torch.exp(old_log_probs.float())
    counts = bucket_counts(p, batch.response_mask)
    live = bucket_counts(p, batch.response_mask * (adv != 0).float())
    # a bucket without a token of non-zero advantage has no loss at all: no norm, not 0
    norms = [grad_norm(bank[f"b{b}"]) if live[b] > 0 else None for b in range(NUM_BUCKETS)]
    lo, hi = norms[0], norms[-1]
    return {
        "grad_norm": per_bucket_dict(norms),
        "tokens": per_bucket_dict(counts),
        "tokens_with_nonzero_advantage": per_bucket_dict(live),
        "ratio_lowest_to_highest_bucket": lo / hi if lo is not None and hi else None,
        "monotone_decreasing": is_monotone_decreasing(norms),
        "advantage_source": batch.advantage_source,
        "bucket_names": list(BUCKET_NAMES),
    }
