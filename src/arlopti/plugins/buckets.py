"""Token-probability buckets and the per-bucket statistics every analysis reports (pure tensor code).

The four buckets are the paper's fixed probability intervals (the official ``mask_prob_intervalK``
options), closed on the left only for the first one:

    b0 = [0, 0.25],  b1 = (0.25, 0.5],  b2 = (0.5, 0.75],  b3 = (0.75, 1]

``p`` is always the probability of the *sampled* token under the policy that sampled it, at the
rollout temperature (``exp(old_log_probs)``). Every function takes a ``mask`` (``[B, T]``, 1 on
valid response tokens) and ignores the other positions. Statistics of an empty bucket are NaN,
never 0, so that "no tokens" is not confused with "none of them moved".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: The paper's bucket edges, the one place they are written: every name, label and statistic follows.
BUCKET_EDGES: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


def _short(x: float) -> str:
    """``.25`` for 0.25, ``0`` and ``1`` for the ends (the paper's figure labels)."""
    text = f"{x:g}"
    return text[1:] if text.startswith("0.") else text


# Tag-safe names, used in JSON keys and TensorBoard tags (diag/bucket_frac/<name>): "0.00-0.25", ...
BUCKET_NAMES: tuple[str, ...] = tuple(f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(BUCKET_EDGES, BUCKET_EDGES[1:]))
# Interval labels of figures and tables: "[0, .25]", "(.25, .5]", "(.5, .75]", "(.75, 1]" (only b0 closed on the left)
BUCKET_LABELS: tuple[str, ...] = tuple(f"{'[' if i == 0 else '('}{_short(lo)}, {_short(hi)}]"
                                       for i, (lo, hi) in enumerate(zip(BUCKET_EDGES, BUCKET_EDGES[1:])))
NUM_BUCKETS = len(BUCKET_NAMES)
PROB_TOLERANCE = 1e-3  # how far outside [0, 1] a probability may be from rounding (bucket_index)


def bucket_index(p: Tensor) -> Tensor:
    """Bucket of each probability, long, same shape: 0 for p ≤ .25, 1 for .25 < p ≤ .5, … (see module doc).

    Probabilities a little above 1 are rounding (a fused or bf16 log-prob kernel can return log p
    slightly above 0, e.g. 1e-5) and fall in the top bucket. Values outside [-1e-3, 1 + 1e-3]
    raise ``ValueError``: they are log-probs passed by mistake, or garbage.
    """
    if p.numel() and (float(p.min()) < -PROB_TOLERANCE or float(p.max()) > 1 + PROB_TOLERANCE):
        raise ValueError(f"bucket_index: probabilities must lie in [0, 1], got range "
                         f"[{float(p.min()):.4g}, {float(p.max()):.4g}] (pass exp(log_probs), not log_probs)")
    inner = torch.tensor(BUCKET_EDGES[1:-1], dtype=p.dtype, device=p.device)
    # right=False: index i with edges[i-1] < p <= edges[i], so 0.25 falls in b0 and 0.2500001 in b1
    return torch.bucketize(p.contiguous(), inner, right=False)


def _check(p: Tensor, mask: Tensor, *others: Tensor) -> None:
    for t in (mask, *others):
        if t.shape != p.shape:
            raise ValueError(f"shape mismatch: probabilities {tuple(p.shape)} vs {tuple(t.shape)}; every "
                             "per-token tensor must be [B, T] like the response mask")


def bucket_sums(values: Tensor, p: Tensor, mask: Tensor) -> Tensor:
    """``[4]`` float64: Σ of ``values`` over the valid tokens of each bucket."""
    _check(p, mask, values)
    valid = mask.bool()
    idx = bucket_index(p.detach().float())[valid]
    out = torch.zeros(NUM_BUCKETS, dtype=torch.float64, device=p.device)
    return out.scatter_add_(0, idx, values.detach()[valid].double())


def bucket_counts(p: Tensor, mask: Tensor) -> Tensor:
    """``[4]`` float64: number of valid tokens in each bucket."""
    return bucket_sums(torch.ones_like(p), p, mask)


def safe_ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` elementwise, NaN where ``den == 0``."""
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(num, math.nan))


def bucket_fractions(p: Tensor, mask: Tensor) -> Tensor:
    """``[4]``: fraction of the valid tokens in each bucket (sums to 1 when any token is valid)."""
    c = bucket_counts(p, mask)
    return safe_ratio(c, c.sum().expand_as(c))


def bucket_means(values: Tensor, p: Tensor, mask: Tensor) -> Tensor:
    """``[4]``: mean of ``values`` over each bucket's valid tokens (NaN for an empty bucket)."""
    return safe_ratio(bucket_sums(values, p, mask), bucket_counts(p, mask))


def grad_mass(p: Tensor, advantages: Tensor) -> Tensor:
    """Per-token gradient mass ``|A_t| · (1 − p_t)``: the logit-gradient norm of token t's loss up to
    a factor in [1, √2] (‖onehot − softmax‖ ∈ [(1 − p), √2 (1 − p)]). p is clamped to [0, 1] first
    (rounding above 1 gives mass 0, never negative)."""
    return advantages.detach().abs().float() * (1.0 - p.detach().float().clamp(0.0, 1.0))


def grad_mass_shares(p: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``[4]``: each bucket's share of Σ_t |A_t|(1 − p_t) over the valid tokens (NaN if the total is 0)."""
    s = bucket_sums(grad_mass(p, advantages), p, mask)
    return safe_ratio(s, s.sum().expand_as(s))


def update_direction_counts(old_log_probs: Tensor, new_log_probs: Tensor, advantages: Tensor,
                            mask: Tensor) -> dict[str, Tensor]:
    """Counts behind the paper's Fig. 3, per bucket of ``p_old = exp(old_log_probs)``, ``[4]`` float64 each.

    ``pos_up``: tokens with A > 0 whose log-prob strictly rose; ``pos_total``: tokens with A > 0;
    ``neg_down``: tokens with A < 0 whose log-prob strictly fell; ``neg_total``: tokens with A < 0.
    ``pos_same`` / ``neg_same``: tokens of that sign whose log-prob did not change at all (float32
    equality; common for saturated tokens with 1 − p below float resolution).
    Tokens with A = 0 count nowhere. The fractions are ``pos_up / pos_total`` ("updated in the right
    direction" for positive tokens) and ``neg_down / neg_total`` (its mirror for negative tokens).
    """
    p = torch.exp(old_log_probs.detach().float())
    _check(p, mask, new_log_probs, advantages)
    delta = new_log_probs.detach().float() - old_log_probs.detach().float()
    pos, neg = (advantages > 0).float(), (advantages < 0).float()
    return {
        "pos_up": bucket_sums(pos * (delta > 0).float(), p, mask),
        "pos_total": bucket_sums(pos, p, mask),
        "neg_down": bucket_sums(neg * (delta < 0).float(), p, mask),
        "neg_total": bucket_sums(neg, p, mask),
        "pos_same": bucket_sums(pos * (delta == 0).float(), p, mask),
        "neg_same": bucket_sums(neg * (delta == 0).float(), p, mask),
    }


def update_direction_fractions(counts: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """``(pos_frac [4], neg_frac [4])`` from :func:`update_direction_counts` (NaN for no such tokens)."""
    return safe_ratio(counts["pos_up"], counts["pos_total"]), safe_ratio(counts["neg_down"], counts["neg_total"])


def stratified_token_sample(p: Tensor, mask: Tensor, cap: int, generator: torch.Generator | None = None
                            ) -> list[tuple[int, int]]:
    """Up to ``cap`` valid positions ``(row, col)``, spread as evenly as possible over the buckets.

    Each bucket gets ``cap // 4`` draws (without replacement, uniformly at random within the bucket);
    draws a bucket cannot fill (too few tokens) go to the other buckets, in bucket order, until
    ``cap`` positions are taken or the tokens run out. Returned sorted by (row, col).
    """
    if cap < 1:
        raise ValueError(f"stratified_token_sample: cap must be >= 1, got {cap}")
    _check(p, mask)
    valid = mask.bool()
    idx = bucket_index(p.detach().float())
    pools = []
    for b in range(NUM_BUCKETS):
        pos = ((idx == b) & valid).nonzero()
        perm = torch.randperm(len(pos), generator=generator)
        pools.append(pos[perm])
    want = [min(cap // NUM_BUCKETS, len(pool)) for pool in pools]
    spare = cap - sum(want)
    for b in range(NUM_BUCKETS):
        extra = min(spare, len(pools[b]) - want[b])
        want[b] += extra
        spare -= extra
    picked = [tuple(int(v) for v in row) for b in range(NUM_BUCKETS) for row in pools[b][:want[b]]]
    return sorted(picked)


def per_bucket_dict(values: Tensor | list[float]) -> dict[str, float | None]:
    """``{bucket name: value}`` with NaN written as None (JSON has no NaN)."""
    vals = values.tolist() if isinstance(values, Tensor) else list(values)
    if len(vals) != NUM_BUCKETS:
        raise ValueError(f"per_bucket_dict: expected {NUM_BUCKETS} values, got {len(vals)}")
    return {name: (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
            for name, v in zip(BUCKET_NAMES, vals)}


def is_monotone_decreasing(values: list[float | None]) -> bool | None:
    """True when every non-missing value is strictly below the previous non-missing one; None when
    fewer than two values are present (nothing to compare)."""
    seq = [v for v in values if v is not None and not math.isnan(v)]
    if len(seq) < 2:
        return None
    return all(b < a for a, b in zip(seq, seq[1:]))


def prob_bin_counts(p: Tensor, mask: Tensor, bins: int = 20) -> Tensor:
    """``[bins]`` float64: counts of the valid tokens' p in ``bins`` equal bins of [0, 1]; bin i holds
    i/bins ≤ p < (i+1)/bins (computed in float64 from ``p``'s own dtype), p = 1 falls in the last.
    A valid token with a non-finite p is a ``ValueError`` (it belongs to no bin)."""
    if bins < 1:
        raise ValueError(f"histogram bins must be >= 1, got {bins}")
    _check(p, mask)
    v = p.detach().double()[mask.bool()]
    bad = int((~torch.isfinite(v)).sum())
    if bad:  # NaN would become int64's minimum as a bin index (issue 42: "index -9223372036854775808")
        raise ValueError(f"prob_bin_counts: {bad} of the {v.numel()} valid tokens have a non-finite probability; "
                         "leave them out of the mask (arlopti.learner.diagnostics counts them apart)")
    idx = (v * bins).floor().clamp(0, bins - 1).long()
    return torch.zeros(bins, dtype=torch.float64, device=p.device).scatter_add_(0, idx, torch.ones_like(v))


def token_distribution(p: Tensor, advantages: Tensor, mask: Tensor, bins: int = 20) -> dict:
    """Paper Fig. 1(a, b): how the sampled tokens spread over p, and their advantages per bucket.

    ``histogram``: counts of the valid tokens' p in ``bins`` equal bins of [0, 1] (bin i holds
    i/bins ≤ p < (i+1)/bins, p = 1 in the last); ``fraction``: share of the valid tokens per
    bucket; per bucket over its valid tokens, ``adv_mean``, ``adv_abs_mean``, ``adv_pos_frac``
    (share with A > 0) and ``adv_quantiles`` (5, 25, 50, 75, 95th percentiles of A, None for an
    empty bucket).
    """
    _check(p, mask, advantages)
    valid = mask.bool()
    pv = p.detach().double()[valid]
    av = advantages.detach().double()[valid]
    idx = bucket_index(pv)
    hist = prob_bin_counts(p, mask, bins)
    qs = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64, device=av.device)
    quant = {}
    for b, name in enumerate(BUCKET_NAMES):
        sel = av[idx == b]
        quant[name] = torch.quantile(sel, qs).tolist() if sel.numel() else None
    return {
        "tokens": int(valid.sum()), "bins": bins, "histogram": hist.tolist(),
        "fraction": per_bucket_dict(bucket_fractions(p, mask)),
        "adv_mean": per_bucket_dict(bucket_means(advantages, p, mask)),
        "adv_abs_mean": per_bucket_dict(bucket_means(advantages.abs(), p, mask)),
        "adv_pos_frac": per_bucket_dict(bucket_means((advantages > 0).float(), p, mask)),
        "adv_quantiles": quant, "quantile_levels": qs.tolist(),
    }
