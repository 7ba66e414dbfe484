"""``TokenDiagnosticsCallback``: cheap per-step token-probability diagnostics for TensorBoard.

Read from ``pl_module.last_step_context`` in ``on_train_batch_end`` (the step's update is done).
With ``p = exp(old_log_probs)`` (rollout-time, at the rollout temperature) and the buckets of
:mod:`arlopti.analysis.buckets`, every ``every_n_steps`` rollout steps it logs

* ``diag/bucket_frac/<b>``: fraction of the valid response tokens in bucket b (sums to 1);
* ``diag/grad_mass_share/<b>``: bucket b's share of Σ_t |A_t|·(1 − p_t) with the advantages the
  update used (after AR): the logit-gradient mass, since ‖∂log p/∂z‖ ∈ [(1 − p), √2 (1 − p)];
  with AR on, also ``diag/grad_mass_share_raw/<b>`` (the same with the advantages before AR);
* ``diag/ar_weight/<b>``: mean AR weight α·p + 1 − α of bucket b (only when ``ar_alpha`` > 0);
* ``diag/lopti_tokens/<phase>`` and ``diag/lopti_grad_mass_share/<phase>``: under Lopti, each
  phase's token count (``low``: p_old < η) and its share of the gradient mass;
* ``diag/token_prob_hist``: a TensorBoard histogram of p over the valid tokens, in
  ``hist_bins`` equal bins of [0, 1] (fixed bins, so ranks add their counts; the learner's own
  ``rollout/token_prob_hist`` covers rank 0's tokens only). Loggers without ``add_histogram_raw``
  (anything but TensorBoard) get the scalars only;
* ``timing/diagnostics_s``: the wall time this callback took at this step.

Every ``update_direction_every_n_steps`` rollout steps it also measures the paper's Fig. 3 on the
update batch: one extra no-grad forward of the whole batch with the **post-update** weights, at the
rollout temperature, in chunks of ``sizes.logprob_micro_batch_size`` under the trainer's precision
context, compared with ``old_log_probs``. (Lopti's phase-2 forward cannot be reused: it runs at the
weights *between* the two phases, not after the update.) The learner computes ``old_log_probs``
in its own chunking, and those of the first mini-batch from its training forward, so with
unchanged weights the two agree to float rounding only: a token whose log-prob moved by less than
that (a saturated token, 1 − p ≈ 0) can count either way.

* ``diag/update_dir_pos/<b>``: among tokens with A > 0 (before AR), the fraction whose log-prob rose;
* ``diag/update_dir_neg/<b>``: among tokens with A < 0, the fraction whose log-prob fell.

A bucket without such tokens is not logged at that step (no NaN in TensorBoard).

Distributed: every rank computes its own sums (the extra forward is a collective under FSDP2, so
every rank must run it), the sums are added over ranks, and global rank 0 logs; the fractions are
therefore over the global batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import lightning.pytorch as L
import torch
from torch import Tensor

from arlopti.algorithms import ar_weights
from arlopti.analysis.buckets import (BUCKET_NAMES, bucket_counts, bucket_sums, grad_mass, prob_bin_counts,
                                      update_direction_counts)

HIST_BINS = 20


def prob_histogram(p: Tensor, mask: Tensor, bins: int = HIST_BINS) -> Tensor:
    """``[bins + 3]`` float64: counts of the valid tokens' p in ``bins`` equal bins of [0, 1]
    (bin i holds i/bins ≤ p < (i+1)/bins, p = 1 in the last), then Σp, Σp² and the count.

    All entries are sums, so ranks combine by adding (what TensorBoard's ``add_histogram_raw``
    needs, except min and max, which :meth:`TokenDiagnosticsCallback` reduces separately).
    """
    if bins < 1:
        raise ValueError(f"callbacks.diagnostics.hist_bins={bins} must be >= 1")
    counts = prob_bin_counts(p, mask, bins)
    v = p.detach().double()[mask.bool()]
    return torch.cat([counts, torch.stack([v.sum(), (v * v).sum(), torch.tensor(float(v.numel()),
                                                                                  dtype=torch.float64,
                                                                                  device=p.device)])])


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

    def flat(self) -> tuple[Tensor, list[tuple[str, int]]]:
        """All sums in one 1-D tensor plus the (name, length) layout, for one all-reduce."""
        parts, layout = [self.counts, self.mass], [("counts", 4), ("mass", 4)]
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
                   ar_weight=out.get("ar_weight"), hist=out.get("hist"))
        sums.phase_mass = {k.split(":", 1)[1]: v[0] for k, v in out.items() if k.startswith("phase_mass:")}
        sums.phase_tokens = {k.split(":", 1)[1]: v[0] for k, v in out.items() if k.startswith("phase_tokens:")}
        sums.direction = {k.split(":", 1)[1]: v for k, v in out.items() if k.startswith("direction:")}
        return sums


def step_sums(old_log_probs: Tensor, response_mask: Tensor, advantages: Tensor, advantages_raw: Tensor,
              ar_alpha: float = 0.0, phases=None, hist_bins: int | None = HIST_BINS) -> DiagnosticSums:
    """The cheap per-bucket sums of one step (no forward pass). ``phases``: the learner's phase list;
    ``hist_bins``: bins of the probability histogram (None = no histogram)."""
    p = torch.exp(old_log_probs.detach().float())
    mask = response_mask
    mass_tok = grad_mass(p, advantages)
    sums = DiagnosticSums(counts=bucket_counts(p, mask), mass=bucket_sums(mass_tok, p, mask))
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
    for k, v in sums.phase_tokens.items():
        out[f"{prefix}/lopti_tokens/{k}"] = float(v)
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


class TokenDiagnosticsCallback(L.Callback):
    """See the module docstring. ``every_n_steps`` / ``update_direction_every_n_steps``: null = never."""

    def __init__(self, every_n_steps: int | None = 1, update_direction_every_n_steps: int | None = 10,
                 micro_batch_size: int | None = None, prefix: str = "diag", hist_bins: int | None = HIST_BINS):
        for name, v in (("every_n_steps", every_n_steps),
                        ("update_direction_every_n_steps", update_direction_every_n_steps),
                        ("micro_batch_size", micro_batch_size), ("hist_bins", hist_bins)):
            if v is not None and v < 1:
                raise ValueError(f"callbacks.diagnostics.{name}={v} must be >= 1 or null")
        self.hist_bins = hist_bins
        self.every_n_steps = every_n_steps
        self.update_direction_every_n_steps = update_direction_every_n_steps
        self.micro_batch_size = micro_batch_size
        self.prefix = prefix
        self.last_metrics: dict[str, float] = {}
        self.last_hist: Tensor | None = None  # the last logged prob_histogram sums (tests read it)
        self.enabled = True  # benchmarks toggle it to time steps with and without

    @staticmethod
    def _due(every: int | None, step: int) -> bool:
        return every is not None and step % every == 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = getattr(pl_module, "last_step_context", None)
        step = int(getattr(pl_module, "rollout_step", 0))
        cheap = self._due(self.every_n_steps, step)
        direction = self._due(self.update_direction_every_n_steps, step)
        if ctx is None or not self.enabled or not (cheap or direction):
            return
        t0 = time.perf_counter()
        exp = ctx.experience
        cfg = pl_module.cfg
        sums = step_sums(ctx.old_log_probs, exp.response_mask, ctx.advantages, ctx.advantages_raw,
                         cfg.algorithm.ar_alpha, ctx.phases, self.hist_bins if cheap else None)
        if direction:
            mb = self.micro_batch_size or cfg.sizes.logprob_micro_batch_size
            plugin = getattr(trainer, "precision_plugin", None)
            fwd = plugin.forward_context() if plugin is not None else contextlib.nullcontext()
            with fwd:
                new_logp = post_update_log_probs(pl_module.policy, exp, pl_module.temperature, mb)
            sums.direction = update_direction_counts(ctx.old_log_probs, new_logp, ctx.advantages_raw,
                                                     exp.response_mask)
        p_range = prob_range(ctx.old_log_probs, exp.response_mask) if sums.hist is not None else None
        if trainer.world_size > 1:
            flat, layout = sums.flat()
            flat = trainer.strategy.reduce(flat.to(pl_module.device), reduce_op="sum").cpu()
            sums = DiagnosticSums.unflat(flat, layout)
            if p_range is not None:  # [-min, max], both by max over ranks
                mm = torch.tensor([-p_range[0], p_range[1]], dtype=torch.float64, device=pl_module.device)
                mm = trainer.strategy.reduce(mm, reduce_op="max").cpu()
                p_range = (-float(mm[0]), float(mm[1]))
        metrics = metrics_from_sums(sums, self.prefix)
        if not cheap:  # an update-direction-only step logs only those tags
            metrics = {k: v for k, v in metrics.items() if "/update_dir_" in k}
        self.last_hist = sums.hist
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                writer = getattr(lg, "experiment", None)
                if sums.hist is not None and p_range is not None and hasattr(writer, "add_histogram_raw"):
                    log_histogram(writer, f"{self.prefix}/token_prob_hist", sums.hist, p_range, step)
        metrics["timing/diagnostics_s"] = time.perf_counter() - t0
        self.last_metrics = metrics
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=step)


def prob_range(old_log_probs: Tensor, mask: Tensor) -> tuple[float, float]:
    """``(min p, max p)`` over this rank's valid tokens; ``(inf, -inf)`` when there is none."""
    v = torch.exp(old_log_probs.detach().double())[mask.bool()]
    if not v.numel():
        return (math.inf, -math.inf)  # neutral for the max-reduction over ranks
    return float(v.min()), float(v.max())


def log_histogram(writer, tag: str, hist: Tensor, p_range: tuple[float, float], step: int) -> bool:
    """Write :func:`prob_histogram` sums as a TensorBoard histogram; False (nothing written) with no tokens."""
    bins = int(hist.numel()) - 3
    counts, (s1, s2, n) = hist[:bins].tolist(), hist[bins:].tolist()
    if n <= 0 or not math.isfinite(p_range[0]):
        return False
    limits = [(i + 1) / bins for i in range(bins)]
    writer.add_histogram_raw(tag, min=p_range[0], max=p_range[1], num=int(n), sum=s1, sum_squares=s2,
                             bucket_limits=limits, bucket_counts=counts, global_step=step)
    return True
