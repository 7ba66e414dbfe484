"""``TokenDiagnosticsCallback``: cheap per-step token-probability diagnostics for TensorBoard.

Read from ``pl_module.last_step_context`` in ``on_train_batch_end`` (the step's update is done).
With ``p = exp(old_log_probs)`` (rollout-time, at the rollout temperature) and the buckets of
:mod:`arlopti.plugins.buckets` (the sums and fractions are the pure functions of
:mod:`arlopti.learner.diagnostics`), every ``every_n_steps`` rollout steps it logs

* ``diag/bucket_frac/<b>``: fraction of the valid response tokens in bucket b (sums to 1);
* ``diag/grad_mass_share/<b>``: bucket b's share of Σ_t |A_t|·(1 − p_t) with the advantages the
  update used (after AR): the logit-gradient mass, since ‖∂log p/∂z‖ ∈ [(1 − p), √2 (1 − p)];
  with AR on, also ``diag/grad_mass_share_raw/<b>`` (the same with the advantages before AR);
* ``diag/ar_weight/<b>``: mean AR weight α·p + 1 − α of bucket b (only when ``ar_alpha`` > 0);
* ``diag/lopti_grad_mass_share/<phase>``: under Lopti, each phase's share of the gradient mass
  (``low``: p_old < η; the learner logs the token counts as ``lopti/<phase>_tokens``);
* ``diag/token_prob_hist``: a TensorBoard histogram of p over the valid tokens, in
  ``hist_bins`` equal bins of [0, 1] (fixed bins, so ranks add their counts, every rank's tokens
  are in it). Loggers without ``add_histogram_raw``
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

A bucket without such tokens is not logged at that step (no NaN in TensorBoard). A token whose
log-prob (before or after the update) is NaN is left out of every tag, with a warning that counts
them (:mod:`arlopti.learner.diagnostics`; issue 42: such a token used to crash the callback).

Distributed: every rank computes its own sums (the extra forward is a collective under FSDP2, so
every rank must run it), the sums are added over ranks, and global rank 0 logs; the fractions are
therefore over the global batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

import lightning.pytorch as L
import torch
from torch import Tensor

from arlopti.callbacks.cadence import check_every, due
from arlopti.plugins.buckets import update_direction_counts
from arlopti.learner.diagnostics import (HIST_BINS, DiagnosticSums, finite_tokens, metrics_from_sums,
                                          post_update_log_probs, prob_range, step_sums)

log = logging.getLogger(__name__)


class TokenDiagnosticsCallback(L.Callback):
    """See the module docstring. ``every_n_steps`` / ``update_direction_every_n_steps``: null = never."""

    def __init__(self, every_n_steps: int | None = 1, update_direction_every_n_steps: int | None = 10,
                 micro_batch_size: int | None = None, prefix: str = "diag", hist_bins: int | None = HIST_BINS):
        for name, v in (("every_n_steps", every_n_steps),
                        ("update_direction_every_n_steps", update_direction_every_n_steps),
                        ("micro_batch_size", micro_batch_size), ("hist_bins", hist_bins)):
            check_every(f"callbacks.diagnostics.{name}", v)
        self.hist_bins = hist_bins
        self.every_n_steps = every_n_steps
        self.update_direction_every_n_steps = update_direction_every_n_steps
        self.micro_batch_size = micro_batch_size
        self.prefix = prefix
        self.last_metrics: dict[str, float] = {}
        self.last_hist: Tensor | None = None  # the last logged prob_histogram sums (tests read it)
        self.enabled = True  # benchmarks toggle it to time steps with and without

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = getattr(pl_module, "last_step_context", None)
        step = int(getattr(pl_module, "rollout_step", 0))
        cheap = due(self.every_n_steps, step)
        direction = due(self.update_direction_every_n_steps, step)
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
            kept = finite_tokens(exp.response_mask, ctx.old_log_probs, new_logp)
            sums.direction = update_direction_counts(ctx.old_log_probs, new_logp, ctx.advantages_raw,
                                                     kept.to(exp.response_mask.dtype))
            # the tokens only the post-update forward made NaN (step_sums counted those of logπ_old)
            sums.nonfinite = sums.nonfinite + (finite_tokens(exp.response_mask, ctx.old_log_probs) & ~kept).sum()
        p_range = prob_range(ctx.old_log_probs, exp.response_mask) if sums.hist is not None else None
        if trainer.world_size > 1:
            flat, layout = sums.flat()
            flat = trainer.strategy.reduce(flat.to(pl_module.device), reduce_op="sum").cpu()
            sums = DiagnosticSums.unflat(flat, layout)
            if p_range is not None:  # [-min, max], both by max over ranks
                mm = torch.tensor([-p_range[0], p_range[1]], dtype=torch.float64, device=pl_module.device)
                mm = trainer.strategy.reduce(mm, reduce_op="max").cpu()
                p_range = (-float(mm[0]), float(mm[1]))
        if float(sums.nonfinite) > 0 and trainer.is_global_zero:
            log.warning("diagnostics at rollout step %d: %d response tokens have a NaN log-prob (diverged weights) "
                        "and are left out of the %s/* tags", step, int(sums.nonfinite), self.prefix)
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


def log_histogram(writer, tag: str, hist: Tensor, p_range: tuple[float, float], step: int) -> bool:
    """Write :func:`~arlopti.learner.diagnostics.prob_histogram` sums as a TensorBoard histogram; False (nothing written) with no tokens."""
    bins = int(hist.numel()) - 3
    counts, (s1, s2, n) = hist[:bins].tolist(), hist[bins:].tolist()
    if n <= 0 or not math.isfinite(p_range[0]):
        return False
    limits = [(i + 1) / bins for i in range(bins)]
    writer.add_histogram_raw(tag, min=p_range[0], max=p_range[1], num=int(n), sum=s1, sum_squares=s2,
                             bucket_limits=limits, bucket_counts=counts, global_step=step)
    return True
