"""Per-step token-probability statistics of the update batch: the sums behind the ``diag/*`` tags.

Pure tensor functions (no Lightning); :class:`arlopti.callbacks.diagnostics.TokenDiagnosticsCallback`
decides when to compute them, adds them over ranks and logs them (its module docstring lists the
tags). With ``p = exp(old_log_probs)`` and the buckets of :mod:`arlopti.plugins.buckets`:

* :func:`step_sums`: the cheap per-bucket sums of one step (token counts, gradient mass
  Σ_t |A_t|·(1 − p_t) with the advantages after and before AR, AR weights, Lopti phase mass, the
  probability histogram), as a :class:`DiagnosticSums` whose fields are all sums, so ranks
  combine by adding (:meth:`DiagnosticSums.flat` packs them for one all-reduce);
* :func:`metrics_from_sums`: the logged fractions from (all-reduced) sums, empty buckets left out;
* :func:`prob_histogram` / :func:`prob_range`: the histogram sums of p and this rank's (min, max);
* :func:`post_update_log_probs`: the extra no-grad forward with the post-update weights that the
  update-direction fractions (the paper's Fig. 3) compare with ``old_log_probs``.

A valid token whose log-prob is NaN (diverged weights; the learner stops at such a step, but a
post-update forward or another caller can still hold one) belongs to no bucket: every function here
leaves it out (:func:`finite_tokens`) and :attr:`DiagnosticSums.nonfinite` counts it, so that NaN is
never cast to a bin index (issue 42: ``index -9223372036854775808 is out of bounds``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from arlopti.algorithms import ar_weights
from arlopti.plugins.buckets import BUCKET_NAMES, bucket_counts, bucket_sums, grad_mass, prob_bin_counts

HIST_BINS = 20


def prob_histogram(p: Tensor, mask: Tensor, bins: int = HIST_BINS) -> Tensor:
    """``[bins + 3]`` float64: counts of the valid tokens' p in ``bins`` equal bins of [0, 1]
    (bin i holds i/bins ≤ p < (i+1)/bins, p = 1 in the last), then Σp, Σp² and the count; tokens
    with a non-finite p are left out (:func:`finite_tokens`).

    All entries are sums, so ranks combine by adding (what TensorBoard's ``add_histogram_raw``
    needs, except min and max: see :func:`prob_range`).
    """
    if bins < 1:
        raise ValueError(f"callbacks.diagnostics.hist_bins={bins} must be >= 1")
    mask = finite_tokens(mask, p)
    counts = prob_bin_counts(p, mask, bins)
    v = p.detach().double()[mask.bool()]
    return torch.cat([counts, torch.stack([v.sum(), (v * v).sum(), torch.tensor(float(v.numel()),
                                                                                  dtype=torch.float64,
                                                                                  device=p.device)])])


def finite_tokens(mask: Tensor, *values: Tensor) -> Tensor:
    """Bool ``[B, T]``: the valid tokens (``mask``) at which every one of ``values`` is finite."""
    keep = mask.bool()
    for v in values:
        keep = keep & torch.isfinite(v)
    return keep


@dataclass
class DiagnosticSums:
    """Additive per-bucket sums of one step (so ranks can be combined by summing), ``[4]`` float64 each."""

    counts: Tensor
    mass: Tensor
    mass_raw: Tensor | None = None
    ar_weight: Tensor | None = None
    phase_mass: dict[str, Tensor] = field(default_factory=dict)  # phase name -> scalar
    phase_tokens: dict[str, Tensor] = field(default_factory=dict)  # phase name -> scalar token count
    hist: Tensor | None = None  # prob_histogram: [bins + 3]
    direction: dict[str, Tensor] = field(default_factory=dict)  # update_direction_counts keys
    nonfinite: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))  # valid tokens left out

    def flat(self) -> tuple[Tensor, list[tuple[str, int]]]:
        """All sums in one 1-D tensor plus the (name, length) layout, for one all-reduce."""
        parts, layout = [self.counts, self.mass, self.nonfinite], [("counts", 4), ("mass", 4), ("nonfinite", 1)]
        for name in ("mass_raw", "ar_weight"):
            v = getattr(self, name)
            if v is not None:
                parts.append(v)
                layout.append((name, 4))
        for k, v in sorted(self.phase_mass.items()):
            parts.append(v.reshape(1))
            layout.append((f"phase_mass:{k}", 1))
        for k, v in sorted(self.phase_tokens.items()):
            parts.append(v.reshape(1))
            layout.append((f"phase_tokens:{k}", 1))
        if self.hist is not None:
            parts.append(self.hist)
            layout.append(("hist", int(self.hist.numel())))
        for k, v in sorted(self.direction.items()):
            parts.append(v)
            layout.append((f"direction:{k}", 4))
        return torch.cat([p.double().reshape(-1) for p in parts]), layout

    @classmethod
    def unflat(cls, flat: Tensor, layout: list[tuple[str, int]]) -> "DiagnosticSums":
        out, pos = {}, 0
        for name, n in layout:
            out[name] = flat[pos:pos + n]
            pos += n
        sums = cls(counts=out["counts"], mass=out["mass"], mass_raw=out.get("mass_raw"),
                   ar_weight=out.get("ar_weight"), hist=out.get("hist"), nonfinite=out["nonfinite"][0])
        sums.phase_mass = {k.split(":", 1)[1]: v[0] for k, v in out.items() if k.startswith("phase_mass:")}
        sums.phase_tokens = {k.split(":", 1)[1]: v[0] for k, v in out.items() if k.startswith("phase_tokens:")}
        sums.direction = {k.split(":", 1)[1]: v for k, v in out.items() if k.startswith("direction:")}
        return sums


def step_sums(old_log_probs: Tensor, response_mask: Tensor, advantages: Tensor, advantages_raw: Tensor,
              ar_alpha: float = 0.0, phases=None, hist_bins: int | None = HIST_BINS) -> DiagnosticSums:
    """The cheap per-bucket sums of one step (no forward pass). ``phases``: the learner's phase list;
    ``hist_bins``: bins of the probability histogram (None = no histogram). Valid tokens with a NaN
    log-prob are left out of every sum and counted in ``nonfinite``."""
    raw = torch.exp(old_log_probs.detach().float())
    mask = finite_tokens(response_mask, raw).to(response_mask.dtype)
    p = torch.where(mask.bool(), raw, torch.zeros_like(raw))  # no NaN reaches bucket_index, even off the mask
    mass_tok = grad_mass(p, advantages)
    sums = DiagnosticSums(counts=bucket_counts(p, mask), mass=bucket_sums(mass_tok, p, mask),
                          nonfinite=(response_mask.bool() & ~mask.bool()).sum().double())
    if hist_bins is not None:
        sums.hist = prob_histogram(p, mask, hist_bins)
    if ar_alpha > 0:
        sums.mass_raw = bucket_sums(grad_mass(p, advantages_raw), p, mask)
        sums.ar_weight = bucket_sums(ar_weights(old_log_probs, ar_alpha), p, mask)
    for ph in phases or []:
        if ph.name != "all":
            sel = ph.token_mask.bool() & mask.bool()
            sums.phase_mass[ph.name] = (mass_tok * sel).sum().double()
            sums.phase_tokens[ph.name] = sel.sum().double()
    return sums


def metrics_from_sums(sums: DiagnosticSums, prefix: str = "diag") -> dict[str, float]:
    """Turn (all-reduced) sums into the logged metrics; empty buckets are left out (module doc)."""
    out: dict[str, float] = {}
    total = float(sums.counts.sum())
    mass_total = float(sums.mass.sum())

    def put(group: str, num: Tensor, den: Tensor | float) -> None:
        den_t = den if isinstance(den, Tensor) else torch.full_like(num, float(den))
        for name, a, b in zip(BUCKET_NAMES, num.tolist(), den_t.tolist()):
            if b > 0:
                out[f"{prefix}/{group}/{name}"] = a / b

    if total > 0:
        put("bucket_frac", sums.counts, total)
    if mass_total > 0:
        put("grad_mass_share", sums.mass, mass_total)
    if sums.mass_raw is not None and float(sums.mass_raw.sum()) > 0:
        put("grad_mass_share_raw", sums.mass_raw, float(sums.mass_raw.sum()))
    if sums.ar_weight is not None:
        put("ar_weight", sums.ar_weight, sums.counts)
    if mass_total > 0:
        for k, v in sums.phase_mass.items():
            out[f"{prefix}/lopti_grad_mass_share/{k}"] = float(v) / mass_total
    if sums.direction:
        put("update_dir_pos", sums.direction["pos_up"], sums.direction["pos_total"])
        put("update_dir_neg", sums.direction["neg_down"], sums.direction["neg_total"])
    return out


@torch.no_grad()
def post_update_log_probs(policy, experience, temperature: float, micro_batch_size: int) -> Tensor:
    """``[B, R]`` log-probs of the sampled tokens under the current weights (eval mode, no grad)."""
    from arlopti.learner.policy import batched_logprobs

    was_training = policy.training
    policy.eval()
    try:
        logp, _ = batched_logprobs(policy, experience.input_ids, experience.attention_mask,
                                   experience.prompt_len, temperature, micro_batch_size)
    finally:
        policy.train(was_training)
    return logp * experience.response_mask


def prob_range(old_log_probs: Tensor, mask: Tensor) -> tuple[float, float]:
    """``(min p, max p)`` over this rank's valid tokens with a finite p; ``(inf, -inf)`` when there is none."""
    p = torch.exp(old_log_probs.detach().double())
    v = p[finite_tokens(mask, p)]
    if not v.numel():
        return (math.inf, -math.inf)  # neutral for the max-reduction over ranks
    return float(v.min()), float(v.max())
