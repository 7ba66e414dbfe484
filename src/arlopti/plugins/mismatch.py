"""Rollout/trainer mismatch: its per-token correction weights and its metrics (pure tensor code).

The engine (vLLM, or HF ``generate``) sampled each response token y_t from π_engine; the trainer's
``logπ_old`` is the same policy recomputed by the learner's forward, π_trainer. Both are at the
rollout temperature; the engine's are its *processed* log-probs (after temperature, top-k and
top-p, renormalised over the kept tokens), so with ``rollout.top_p < 1`` or ``rollout.top_k > 0``
the two differ by design (log π_engine ≥ log π_trainer by the log of the kept mass), not only by
kernels and precision. Throughout, per valid token::

    d_t = logπ_old,t − logπ_engine,t = log w_t,      w_t = π_trainer(y_t) / π_engine(y_t)

Inputs are ``[B, T]`` (``old_log_probs``: :class:`arlopti.algorithms.inputs.StepInputs` ``.old``;
``engine_log_probs``: ``Experience.engine_logprobs``; both zero on padding) and the response
mask (1 on valid tokens). Positions outside the mask are never read (``d`` is set to 0 there),
so garbage in the padding cannot leak into a weight or a metric. Computation is in float32
(float64 for the metrics), whatever the input dtype.

Corrections, ``algorithm.rollout_correction.mode`` (registry ``ROLLOUT_CORRECTIONS``; all weights
detached, 0 on padding)::

    none     c_t = 1
    tis      c_t = min(w_t, C)                                  token-level truncated IS
    mis      c_t = 1 if a ≤ w_t ≤ b else 0                      token masking (IcePop-style, see below)
    seq_tis  c_t = min(Π_s w_s, C) = exp(min(Σ_s d_s, log C))   for every token t of the response

with C = ``cap``, a = ``mis_low``, b = ``mis_high``; the product runs over the response's valid
tokens and is summed in log space, so a long response's product never overflows or underflows to
inf·0 (a weight at the cap is exactly C). Where the weight enters: the learner multiplies each
token's *policy* loss (the PPO/GSPO/CISPO term, before aggregation) by c_t, the ``token_weight`` of
:mod:`arlopti.algorithms.policy_loss`; the KL and entropy terms are not weighted, and the
normaliser of ``loss_agg`` is unchanged (it still counts every valid token). So a token with
c_t = 0 leaves the loss's numerator but still counts in its denominator.

Sources (restated, not copied):

* verl, ``verl/trainer/ppo/rollout_corr_helper.py`` (read at commit 0b4e2a81):
  ``compute_rollout_correction_weights`` — log ratio ``old_log_prob − rollout_log_prob``; token IS
  ``exp(clamp(log_ratio, −20, 20))``, sequence IS ``exp(clamp(Σ_t log_ratio, −20, 20))`` broadcast to
  the tokens, both zeroed on padding, then truncated at ``rollout_is_threshold`` (default 2) and
  detached; ``compute_rollout_rejection_mask`` — keeps tokens whose ratio lies in
  [``rollout_rs_threshold_lower``, ``rollout_rs_threshold``] (lower default 1/upper), closed at
  both ends. verl's ``compute_policy_loss_*`` in ``core_algos.py`` multiply ``pg_losses`` by
  ``rollout_is_weights`` before ``agg_loss`` with the unchanged ``response_mask``: the same as
  ``tis``/``seq_tis`` here. **Difference:** verl's rejection (its MIS/IcePop counterpart) is
  applied to ``response_mask`` itself, so rejected tokens leave the denominator too; here ``mis``
  is a 0/1 weight and the denominator keeps them (a masked token dilutes the step the way a
  zero-advantage token does). Also unlike verl, no ±20 clamp: ``min(·, C)`` is taken in log space,
  which is exact and cannot overflow.
* TIS: F. Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (2025 blog, cited by verl as https://fengyao.notion.site/off-policy-rl): token weight
  min(π_train/π_rollout, C). Not read here (the page is not in the stored corpus); the formula is
  verl's restatement.
* IcePop: Ring team (Ant Group), "Small Leak Can Sink a Great Ship — Boost RL Training on MoE with
  IcePop" (2025 blog) and the Ring-1T report (arXiv 2510.18855): tokens whose ratio
  π_train/π_infer lies outside [α, β] are excluded from the gradient (confirmed from the blog's
  summary in a later Ring post). Not confirmed here: IcePop's default α, β, and whether its
  normaliser drops the masked tokens. ``mis_low = 0.5``, ``mis_high = 2`` are this project's
  defaults. **Caveat to "IcePop-style":** ``mis`` only masks; inside the band the token's weight is
  1, not its ratio. TRL's token masking (``GRPOTrainer``, ``vllm_importance_sampling_mode``
  ``token_mask``) multiplies each kept token's loss by the ratio w_t itself and zeroes it outside
  its band (``vllm_importance_sampling_clip_min/max``; older versions only above
  ``vllm_importance_sampling_cap``), so on the same band the two drop the same tokens but weigh
  the kept ones differently (by the factor w_t ∈ [a, b]; tests/algorithms/test_algorithm_docs.py).
  Use ``tis`` for a ratio weight.

Metrics (:func:`mismatch_metrics`), over the valid tokens, overall and per probability bucket of
p = exp(logπ_old) (the trainer's probability; :mod:`arlopti.plugins.buckets`)::

    abs_diff_mean        mean |d_t|
    abs_diff_max         max  |d_t|
    k3_kl                mean (e^{d_t} − d_t − 1)    with d_t clamped above at 20
    ratio_outside_frac   fraction of tokens with w_t < 0.5 or w_t > 2
    tokens               number of valid tokens

Direction of ``k3_kl``: the tokens were sampled from π_engine, and r = π_trainer/π_engine = e^d, so
E_engine[r − 1 − log r] = (1 − 1) + E_engine[log π_engine − log π_trainer] = KL(π_engine ‖ π_trainer),
per token position (the sum over a response's tokens estimates the sequence-level KL). Each term
is ≥ 0 (r − 1 ≥ log r), unbiased; the same estimator and direction as verl's ``k3_kl`` in
``compute_offpolicy_metrics`` ("KL(π_rollout ‖ π_training)"). The clamp d ≤ 20 (verl's
``SAFETY_BOUND``) keeps every term ≤ e^20 ≈ 4.9e8, so sums over many tokens stay finite; a token
beyond it makes the value a lower bound (``abs_diff_max`` and ``ratio_outside_frac`` show it).
An empty bucket's statistics are NaN (never 0: "no token" is not "no mismatch"), its ``tokens`` 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from arlopti.config.registries import ROLLOUT_CORRECTIONS
from arlopti.plugins.buckets import BUCKET_NAMES, bucket_index
from arlopti.config import RolloutCorrectionConfig
from arlopti.config import rules as config_rules
from arlopti.config.check import check_setting

#: Metric names of :func:`mismatch_metrics`, each overall (``mismatch/<name>``) and per bucket
#: (``mismatch/<name>/<b>``, ``<b>`` in :data:`arlopti.plugins.buckets.BUCKET_NAMES`).
METRIC_NAMES = ("abs_diff_mean", "abs_diff_max", "k3_kl", "ratio_outside_frac", "tokens")
PREFIX = "mismatch"
RATIO_BAND = (0.5, 2.0)  # ratio_outside_frac counts w outside this closed band
K3_MAX_LOG_RATIO = 20.0  # k3_kl: d clamped above here (verl's SAFETY_BOUND)


def _check(old_log_probs: Tensor, engine_log_probs: Tensor, response_mask: Tensor) -> None:
    if old_log_probs.shape != engine_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(f"rollout mismatch: old_log_probs {tuple(old_log_probs.shape)}, engine_log_probs "
                         f"{tuple(engine_log_probs.shape)} and response_mask {tuple(response_mask.shape)} "
                         "must all be the same [B, T] (engine log-probs: rollout.return_logprobs=true)")
    if old_log_probs.dim() != 2:
        raise ValueError(f"rollout mismatch: expected [B, T] tensors, got {old_log_probs.dim()} dimensions")


def log_ratio(old_log_probs: Tensor, engine_log_probs: Tensor, response_mask: Tensor,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """``d = logπ_old − logπ_engine`` on valid tokens, 0 elsewhere, detached, ``[B, T]`` in ``dtype``."""
    _check(old_log_probs, engine_log_probs, response_mask)
    d = old_log_probs.detach().to(dtype) - engine_log_probs.detach().to(dtype)
    return torch.where(response_mask.bool(), d, torch.zeros_like(d))


def _capped_exp(log_w: Tensor, cap: float) -> Tensor:
    """min(exp(log_w), cap) without forming exp of a large number: exactly ``cap`` where log_w ≥ log cap."""
    log_cap = math.log(cap)
    return torch.where(log_w >= log_cap, torch.full_like(log_w, cap), torch.exp(log_w.clamp(max=log_cap)))


@ROLLOUT_CORRECTIONS.register("none")
def _none(d: Tensor, valid: Tensor, cap: float, mis_low: float, mis_high: float) -> Tensor:
    """no correction (metrics only)

    c_t = 1."""
    return torch.ones_like(d)


@ROLLOUT_CORRECTIONS.register("tis")
def _tis(d: Tensor, valid: Tensor, cap: float, mis_low: float, mis_high: float) -> Tensor:
    """token-level truncated IS: each token's loss times min(w_t, cap)

    c_t = min(exp(d_t), C)."""
    return _capped_exp(d, cap)


@ROLLOUT_CORRECTIONS.register("mis")
def _mis(d: Tensor, valid: Tensor, cap: float, mis_low: float, mis_high: float) -> Tensor:
    """token masking (IcePop): tokens with w_t outside [mis_low, mis_high] leave the loss

    c_t = 1 if mis_low ≤ exp(d_t) ≤ mis_high else 0 (exp overflows to inf: outside, never NaN)."""
    w = torch.exp(d)
    return ((w >= mis_low) & (w <= mis_high)).to(d.dtype)


@ROLLOUT_CORRECTIONS.register("seq_tis")
def _seq_tis(d: Tensor, valid: Tensor, cap: float, mis_low: float, mis_high: float) -> Tensor:
    """sequence-level truncated IS: every token of a response times min(prod_t w_t, cap)

    c_t = exp(min(Σ_s d_s, log C)) for every t of the row (d is 0 on padding: Σ over valid tokens)."""
    return _capped_exp(d.sum(-1, keepdim=True), cap).expand_as(d)


def correction_weights(old_log_probs: Tensor, engine_log_probs: Tensor, response_mask: Tensor,
                       mode: str, cap: float, mis_low: float, mis_high: float) -> Tensor:
    """The rollout-correction weight c_t of each token, ``[B, T]`` float32, detached, 0 on padding.

    ``mode`` is one of :data:`ROLLOUT_CORRECTIONS` (``none | tis | mis | seq_tis``, module docstring):
    ``none`` 1; ``tis`` min(w_t, cap); ``mis`` 1 if mis_low ≤ w_t ≤ mis_high else 0; ``seq_tis``
    min(Π_s w_s, cap) on every token of the response (log space), with w_t = exp(logπ_old,t −
    logπ_engine,t). The caller multiplies each token's policy loss by it; the loss normaliser is
    unchanged (a weight of 0 removes the token from the numerator only; verl's rejection mask
    removes it from the denominator as well). A NaN log-prob on a valid token gives a NaN weight
    (the learner's non-finite guard then skips the step); ±inf give the limits (0 or cap; mis 0).
    The values are ``algorithm.rollout_correction.*`` (no defaults here: they are the schema's,
    :class:`~arlopti.config.RolloutCorrectionConfig`). A bad one is a :class:`~arlopti.config.ConfigError`
    naming the key, from the same checks the config runs: the schema's choices and ranges
    (:func:`~arlopti.config.check.check_setting`) and, for ``mis``, :func:`~arlopti.config.rules.check_mis_bounds`.
    """
    for name, value in (("mode", mode), ("cap", cap), ("mis_low", mis_low), ("mis_high", mis_high)):
        check_setting(RolloutCorrectionConfig, name, value, "algorithm.rollout_correction")
    if mode == "mis":
        config_rules.check_mis_bounds(mis_low, mis_high)  # the config's rule itself, not a copy
    if mode not in ROLLOUT_CORRECTIONS.names():  # "auto": a config value that names no weight until resolved
        raise ValueError(f"algorithm.rollout_correction.mode={mode!r} is resolved per run by "
                         "arlopti.config.rules.effective_correction_mode; pass the resolved mode "
                         f"({', '.join(ROLLOUT_CORRECTIONS.names())})")
    valid = response_mask.bool()
    d = log_ratio(old_log_probs, engine_log_probs, response_mask)
    w = ROLLOUT_CORRECTIONS.get(mode)(d, valid, float(cap), float(mis_low), float(mis_high))
    return torch.where(valid, w, torch.zeros_like(w)).detach()


def _stats(d: Tensor) -> dict[str, float]:
    """The five statistics of a 1-D float64 tensor of valid-token log ratios (NaN when empty)."""
    n = d.numel()
    if n == 0:
        return {"abs_diff_mean": math.nan, "abs_diff_max": math.nan, "k3_kl": math.nan,
                "ratio_outside_frac": math.nan, "tokens": 0.0}
    a = d.abs()
    dk = d.clamp(max=K3_MAX_LOG_RATIO)
    lo, hi = math.log(RATIO_BAND[0]), math.log(RATIO_BAND[1])
    return {"abs_diff_mean": float(a.mean()), "abs_diff_max": float(a.max()),
            "k3_kl": float((torch.exp(dk) - dk - 1).mean()),
            "ratio_outside_frac": float(((d < lo) | (d > hi)).double().mean()), "tokens": float(n)}


def mismatch_metrics(old_log_probs: Tensor, engine_log_probs: Tensor,
                     response_mask: Tensor) -> dict[str, float]:
    """The mismatch statistics over the valid tokens, overall and per bucket of p = exp(logπ_old).

    Keys: ``mismatch/<name>`` and ``mismatch/<name>/<b>`` for every ``<name>`` of
    :data:`METRIC_NAMES` and bucket ``<b>`` of :data:`arlopti.plugins.buckets.BUCKET_NAMES`
    (b0 = p ≤ .25, …, b3 = p > .75; the diagnostics' naming, ``diag/<metric>/<b>``). Formulas and
    the KL direction: module docstring. Means of an empty set are NaN, ``tokens`` is then 0.
    Computed in float64. Raises ``ValueError`` for shapes that differ, or for ``exp(logπ_old)``
    outside [0, 1] on a valid token (log-probs above 0: not log-probs).
    """
    valid = response_mask.bool()
    d = log_ratio(old_log_probs, engine_log_probs, response_mask, torch.float64)[valid]
    p = torch.exp(old_log_probs.detach().double())[valid]
    idx = bucket_index(p)
    out = {f"{PREFIX}/{k}": v for k, v in _stats(d).items()}
    for b, name in enumerate(BUCKET_NAMES):
        for k, v in _stats(d[idx == b]).items():
            out[f"{PREFIX}/{k}/{name}"] = v
    return out
