"""``compare-methods``: GRPO, AR, Lopti, AR + Lopti and every registered method side by side, one batch.

The methods: the four above, then every registered token method (``TOKEN_METHODS`` but ``none``), policy
loss (``POLICY_LOSSES`` but ``ppo_clip``) and advantage estimator (``ADVANTAGE_ESTIMATORS`` but ``grpo``),
read from the registries (:func:`registered_methods`), so a new method appears here by registering.

From the same weights θ and the same batch (``old_log_probs = log π_θ``, so every ratio is 1), for
each method:

* its **effective advantages** A'_t = c_t·A_t at θ: the GRPO advantages A'_t with which plain GRPO's first
  step would equal the method's. How they are found depends on the method's kind:

  - a token method whose shaping is a weight or a mask: c_t is
    :func:`arlopti.plugins.token_methods.effective_weight` of its shaping computed on the whole
    batch (one "micro-batch"; entropy from the same forward): ``adv_weight · keep``. This is exact
    for the first step: at ratio 1 the gradient of :func:`~arlopti.algorithms.grpo_objective` with
    the method equals the plain GRPO gradient with A' (a per-token clip bound is inactive at ratio 1,
    KL-Cov's |logπ − logπ_old| has zero (sub)gradient there, and the analysis has no KL term).
    Consequently **Archer and KL-Cov equal GRPO on a first step from θ**: they act only off-policy
    (later mini-batches / epochs) or through the KL term, which a one-step comparison cannot show;
  - a policy loss, or a token method that adds a term acting at θ (Lp-Reg's KL toward its proxy):
    A'_t = −N·∂L/∂logπ_t of grpo_objective with the method (N the batch's tokens), by autograd on the
    sampled tokens' log-probs — exact whenever the loss's gradient flows only through them. It does
    for every loss but SimKO, whose top-K term also moves the K most likely tokens of a position:
    SimKO's first step is therefore computed on the model (:func:`objective_gradients`), and its A'
    (the sampled tokens' share) feeds only the weight and mass columns. DPPO, SAPO, CE-GPPO, ASPO,
    CISPO and GSPO equal GRPO at ratio 1 (their differences are off-policy), like Archer;
  - an estimator: its advantages recomputed from the batch's own sequence advantages A_i taken as the
    responses' scores (so every estimator sees the signal the GRPO rows see; synthetic ±1 ones
    included), with π_θ's Σ p² for OTB;

  AR: A' = (α·p_old + 1 − α)·A; Lopti: A on the low phase (p_old < η), then the high phase; the
  step-matched controls (:data:`STEP_MATCHED`, asked for by name): GRPO's or AR's A' in two steps, every
  token in both (:func:`base_phases`). Where A is 0, c is reported as 1;
* ``effective_weight``: the mean c_t per bucket of p_old (the multiplier relative to GRPO; Lopti 1);
* ``mass_share``: the gradient-mass share per bucket, Σ|A'_t|·(1 − p_t) over the bucket divided by
  the total (:func:`arlopti.plugins.buckets.grad_mass_shares`; Lopti: both phases' tokens);
* ``bucket_grad_norm``: ‖g_b‖, the global norm of that loss's gradient restricted to bucket b's
  tokens (below; the official ``mask_prob_intervalK`` norm of the method's own loss);
* ``norm_share``: the share of the first step's gradient g contributed by each bucket,
  ⟨g_b, g⟩ / ‖g‖², g_b the gradient of the same loss restricted to bucket b's tokens (the shares
  sum to 1; Lopti and AR + Lopti: of the low phase's step, so the high buckets show 0);
* after the method's update (one optimizer step per phase, a fresh optimizer from θ, as
  :mod:`.update_direction`): the Fig. 3 fractions ``pos_frac`` / ``neg_frac`` per bucket and the
  mean Δp over A > 0 / A < 0 tokens per bucket (:func:`.prob_shift.delta_p_stats`), and the counts
  behind the fractions (:mod:`.direction_counts`): ``pos_rose`` / ``neg_fell`` (k of each fraction's n)
  and, when GRPO is measured, ``vs_grpo``: per bucket and sign the discordant tokens (right way under one
  update and not the other) and the responses that moved more / fewer / as many of their tokens the right
  way as under GRPO. The result's ``support`` gives each bucket and sign's n: its tokens, and the
  responses and groups they come from. The tokens of one batch share one update and are not
  independent: the responses, the groups and the batches are the units.

Every method runs under the analysis's token-mean over all tokens (``AlgorithmConfig``'s settings
elsewhere), whatever aggregation its experiment sets. Buckets are by p_old; the update-direction sign is
that of the GRPO advantage. Clip-Cov and KL-Cov use ``cov_ratio`` (``--cov-ratio``, default 0.02:
verl's 2e-4 would select one token of a ~10³-token batch and show nothing); Lp-Reg's lowest-p share is
its default 0.01 (on a small batch k = ⌊0.01·n⌋ ≤ 1 selects nothing, and it equals GRPO). A method whose
first-step advantages and phases equal an earlier method's is not recomputed: its entry copies that one's
numbers and says ``same_update_as``. Each entry's ``kind`` says how its A' was found.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor

from arlopti.algorithms import (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, LossScale, advantage_reweight, grpo_objective,
                                lopti_masks, outcome_token_rewards)
from arlopti.algorithms.advantages import OldPolicyStats
from arlopti.plugins.buckets import (BUCKET_NAMES, NUM_BUCKETS, bucket_index, bucket_means, grad_mass_shares,
                                     per_bucket_dict, update_direction_counts, update_direction_fractions)
from arlopti.plugins.shaping import Forward, shaping_for
from arlopti.plugins.token_methods import effective_weight, make_context, token_shaping
from arlopti.analysis.direction_counts import discordant, moved_counts, right_way, support
from arlopti.analysis.prob_shift import delta_p_stats
from arlopti.analysis.updates import (LossSpec, WeightSnapshot, accumulate_gradients, add_gradients, apply_gradient,
                                      loss_gradients, make_optimizer, sampled_log_probs)
from arlopti.config import AlgorithmConfig, TokenMethodConfig
from arlopti.config.registries import TOKEN_METHODS
from arlopti.ops.tile_stats import StatsRequest, TokenStats

log = logging.getLogger(__name__)

BASE_METHODS = ("grpo", "ar", "lopti", "ar_lopti")
#: The step-matched controls (issue 51; configs/algorithm/grpo_two_steps.yaml): GRPO's and AR's advantages with
#: Lopti's two optimizer steps, every token in both. Measured when asked for (--methods, the study), not by default.
STEP_MATCHED = ("grpo_two_steps", "ar_two_steps")
#: the defaults each registry's entries are compared against (GRPO is them all)
_DEFAULTS = {"token_method": "none", "policy_loss": "ppo_clip", "estimator": "grpo"}
#: losses whose gradient also leaves the sampled tokens (SimKO's top K): their first step runs on the model
_MODEL_LOSSES = ("simko",)


def registered_methods() -> tuple[str, ...]:
    """The base methods, then every registered token method, policy loss and estimator but the defaults."""
    import arlopti.plugins  # noqa: F401  (fills the registries: the core and every option)

    names = list(BASE_METHODS)
    for kind, reg in (("token_method", TOKEN_METHODS), ("policy_loss", POLICY_LOSSES),
                      ("estimator", ADVANTAGE_ESTIMATORS)):
        names += [n for n in reg.names() if n != _DEFAULTS[kind] and n not in names]
    return tuple(names)


def method_kind(name: str) -> str:
    """``base``, ``token_method``, ``policy_loss`` or ``estimator`` (a name is in one registry only)."""
    if name in BASE_METHODS or name in STEP_MATCHED:
        return "base"
    for kind, reg in (("token_method", TOKEN_METHODS), ("policy_loss", POLICY_LOSSES),
                      ("estimator", ADVANTAGE_ESTIMATORS)):
        if name in reg.names() and name != _DEFAULTS[kind]:
            return kind
    raise ValueError(f"--methods: unknown method {name!r}; choose from {list(registered_methods())}")


METHODS = registered_methods()
#: Every method compare-methods can measure: the default list and the step-matched controls.
KNOWN_METHODS = METHODS + STEP_MATCHED


def base_phases(name: str, valid: Tensor, low: Tensor, high: Tensor) -> list[Tensor]:
    """The token masks of a base method's optimizer steps, in order: Lopti ``[low, high]``, a step-matched
    control ``[valid, valid]`` (Lopti's two steps, every token in both), GRPO and AR ``[valid]``."""
    if name.endswith("lopti"):
        return [low, high]
    return [valid, valid] if name in STEP_MATCHED else [valid]


def method_config(name: str, token_cfg: TokenMethodConfig) -> AlgorithmConfig:
    """The analysis's :class:`~arlopti.config.AlgorithmConfig` of one method (no KL, no entropy bonus)."""
    kind = method_kind(name)
    tm = replace(token_cfg, name=name if kind == "token_method" else "none")
    loss = name if kind == "policy_loss" else "ppo_clip"
    return AlgorithmConfig(kl_coef=0.0, entropy_coef=0.0, token_method=tm, policy_loss=loss,
                           dual_clip=None if kind == "policy_loss" else 10.0)


def method_stats(name: str, token_cfg: TokenMethodConfig, temperature: float) -> StatsRequest:
    """What the method reads of π_θ's full distribution (:mod:`arlopti.plugins.forward_needs`)."""
    from arlopti.plugins.forward_needs import forward_stats, old_pass_stats

    cfg = method_config(name, token_cfg)
    if method_kind(name) == "estimator":
        cfg = replace(cfg, advantage=name)
    return forward_stats(cfg, temperature).merge(old_pass_stats(cfg))


@torch.no_grad()
def sampled_entropy(policy, batch, micro_batch_size: int = 8) -> Tensor:
    """``[B, R]`` per-token entropy of π_θ at the batch's temperature (eval mode), 0 on padding."""
    return sampled_statistics(policy, batch, StatsRequest(), micro_batch_size)[0]


@torch.no_grad()
def sampled_statistics(policy, batch, request: StatsRequest, micro_batch_size: int = 8
                       ) -> tuple[Tensor, TokenStats]:
    """``(entropy [B, R], TokenStats)`` of π_θ at the batch's temperature from one no-grad pass (eval mode),
    0 on padding (the min-p proxy keeps its −inf where a token is filtered)."""
    was = policy.training
    policy.eval()
    ents, parts = [], []
    try:
        for lo in range(0, len(batch), micro_batch_size):
            hi = lo + micro_batch_size
            _, ent, st = policy(batch.input_ids[lo:hi], batch.attention_mask[lo:hi], batch.prompt_len,
                                batch.temperature, True, stats=request)
            ents.append(ent)
            parts.append(st)
    finally:
        policy.train(was)
    mask = batch.response_mask
    stats = TokenStats(*(None if col[0] is None else torch.cat(col) for col in zip(*parts)))
    return torch.cat(ents) * mask, stats


def _loss_advantages(cfg: AlgorithmConfig, logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, entropy: Tensor,
                     dist: TokenStats) -> Tensor:
    """A'_t = −N·∂L/∂logπ_t of grpo_objective with ``cfg`` at ``logp`` (module docstring)."""
    lp = logp.detach().clone().requires_grad_(True)
    n = float(mask.sum())
    if n == 0:
        return torch.zeros_like(adv)
    shaping = shaping_for(cfg, lp, old, adv, mask, mask, Forward(entropy, dist))
    loss, _ = grpo_objective(lp, old, adv, mask, mask, cfg, entropy=entropy, scale=LossScale(n), shaping=shaping)
    (g,) = torch.autograd.grad(loss, lp, allow_unused=True)
    return torch.zeros_like(adv) if g is None else (-g * n).detach() * mask


def _estimator_advantages(name: str, batch, cur: Tensor, dist: TokenStats) -> Tensor:
    """The estimator's token advantages with the batch's sequence advantages as the scores (module docstring)."""
    mask = batch.response_mask
    rewards = outcome_token_rewards(batch.seq_advantages, mask)
    old = OldPolicyStats(cur, dist.sum_p2)
    return ADVANTAGE_ESTIMATORS.get(name)(rewards, mask, batch.group_ids, old=old).to(mask.dtype) * mask


def _multiplier(adv_eff: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """c_t = A'_t / A_t where A_t ≠ 0, else 1."""
    nz = adv != 0
    return torch.where(nz, adv_eff / torch.where(nz, adv, torch.ones_like(adv)), torch.ones_like(adv)) * mask


def method_plan(name: str, old: Tensor, entropy: Tensor, adv: Tensor, mask: Tensor, alpha: float, eta: float,
                token_cfg: TokenMethodConfig, dist: TokenStats | None = None, batch=None,
                cur: Tensor | None = None) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(c, A', phases)`` of one method at θ (module docstring): the per-token multiplier c,
    the effective advantages and the token masks of its phases in order. ``cur`` is logπ_θ (default
    ``old``); ``dist`` π_θ's statistics the method reads; ``batch`` (an estimator's scores)."""
    valid = mask.bool()
    low, high = lopti_masks(old, mask, eta)
    ones = torch.ones_like(adv)
    cur = old if cur is None else cur
    dist = TokenStats() if dist is None else dist
    kind = method_kind(name)
    if name in ("grpo", "lopti", "grpo_two_steps"):
        c = ones
    elif name in ("ar", "ar_lopti", "ar_two_steps"):
        c = advantage_reweight(ones, old, alpha)
    elif kind == "token_method":
        ctx = make_context(cur, old, adv * mask, mask, mask, entropy, dist=dist)
        shaping = token_shaping(ctx, replace(token_cfg, name=name))
        if shaping.proxy_kl_coef is None:  # a weight or mask: exact as c
            c = effective_weight(ctx, shaping)
        else:  # an added term that acts at θ (Lp-Reg)
            c = _multiplier(_loss_advantages(method_config(name, token_cfg), cur, old, adv, mask, entropy, dist),
                            adv, mask)
    elif kind == "policy_loss":
        c = _multiplier(_loss_advantages(method_config(name, token_cfg), cur, old, adv, mask, entropy, dist),
                        adv, mask)
    else:
        if batch is None:
            raise ValueError(f"method {name!r} is an advantage estimator: method_plan needs the batch's scores")
        return _multiplier(_estimator_advantages(name, batch, cur, dist), adv, mask), \
            _estimator_advantages(name, batch, cur, dist), [valid]
    phases = base_phases(name, valid, low, high) if kind == "base" else [valid]
    return c * mask, adv * c, phases


def objective_gradients(policy, batch, old: Tensor, adv: Tensor, cfg: AlgorithmConfig, weights: dict[str, Tensor],
                        request: StatsRequest, micro_batch_size: int = 4) -> dict[str, list[Tensor]]:
    """Per-weight parameter gradients of grpo_objective with ``cfg`` on the model itself (one forward per
    micro-batch with the statistics of ``request``, :func:`~.updates.accumulate_gradients`), each token's loss
    times ``weights[k]`` (the shaping's correction: a 0/1 mask restricts it to a bucket, the shaping still
    sees every token), normalised by the batch's tokens."""
    mask, scale = batch.response_mask, LossScale(float(batch.response_mask.sum()))

    def forward(ids: Tensor, attn: Tensor):
        return policy(ids, attn, batch.prompt_len, batch.temperature, True, stats=request)

    def losses(rows: Tensor, r: int, out) -> Iterator[tuple[str, Tensor]]:
        logp, ent, dist = out
        m, o, a = mask[rows, :r], old[rows, :r], adv[rows, :r]
        for k, w in weights.items():
            shaping = shaping_for(cfg, logp, o, a, m, m, Forward(ent.detach(), dist, None, w[rows, :r]))
            loss, _ = grpo_objective(logp, o, a, m, m, cfg, entropy=ent.detach(), scale=scale, shaping=shaping)
            yield k, loss

    return accumulate_gradients(policy, batch, weights, micro_batch_size, forward, losses)


def _dot(a: list[Tensor], b: list[Tensor]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


def _spec_gradients(policy, batch, old: Tensor, adv_eff: Tensor, micro_batch_size: int):
    """``masks -> bank``: GRPO's gradient with the effective advantages on each mask's tokens."""
    return lambda masks: loss_gradients(policy, batch, old, {k: LossSpec(adv_eff, m) for k, m in masks.items()},
                                        micro_batch_size)


def _method_update(policy, batch, old: Tensor, adv_eff: Tensor, phases: list[Tensor], idx: Tensor, optimizer: str,
                   lr: float, micro_batch_size: int, gradients=None) -> tuple[dict, Tensor]:
    """One method's update from the current weights (module docstring): the per-bucket gradient
    norm shares of its first step, its phases' optimizer steps, then the direction and size of the
    probability changes by bucket; returns them and the updated log-probs ``[B, R]``. ``gradients``
    (``masks -> bank``; default GRPO with ``adv_eff``, :func:`_spec_gradients`) computes a loss's gradient
    restricted to each mask's tokens."""
    mask, adv, p_old = batch.response_mask, batch.advantages, torch.exp(old.float())
    gradients = gradients or _spec_gradients(policy, batch, old, adv_eff, micro_batch_size)
    first = phases[0].bool()
    bank = gradients({f"b{b}": (first & (idx == b)).float() for b in range(NUM_BUCKETS)})
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
            norms.append(apply_gradient(policy, opt, gradients({"p": ph.float()})["p"], None))
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
            "grad_norms": norms, "first_step_grad_norm": gg ** 0.5}, new


def compare_methods(policy, batch, methods: tuple[str, ...], alpha: float, eta: float, optimizer: str = "sgd",
                    lr: float = 1e-2, micro_batch_size: int = 4, old_log_probs: Tensor | None = None, token_cfg: TokenMethodConfig | None = None) -> dict:
    """Every method's numbers (module docstring); the weights are restored afterwards."""
    token_cfg = token_cfg or TokenMethodConfig(cov_ratio=0.02)
    kinds = {m: method_kind(m) for m in methods}
    old = sampled_log_probs(policy, batch, micro_batch_size) if old_log_probs is None else old_log_probs
    mask, adv = batch.response_mask, batch.advantages
    request = StatsRequest()
    for m in methods:
        request = request.merge(method_stats(m, token_cfg, batch.temperature))
    if any(k != "base" for k in kinds.values()):  # entropy and π_θ's statistics in one no-grad pass
        ent, dist = sampled_statistics(policy, batch, replace(request, top_k=0), micro_batch_size)
        cur = sampled_log_probs(policy, batch, micro_batch_size) if old_log_probs is not None else old
    else:
        ent, dist, cur = torch.zeros_like(mask), TokenStats(), old
    p_old = torch.exp(old.float())
    idx = bucket_index(p_old)
    snap = WeightSnapshot(policy)
    results, seen, moved = {}, [], {}
    try:
        for m in methods:
            d = dist if m not in _MODEL_LOSSES else dist._replace(top_log_probs=_top_k(policy, batch, m, token_cfg,
                                                                                        micro_batch_size))
            c, adv_eff, phases = method_plan(m, old, ent, adv, mask, alpha, eta, token_cfg, d, batch, cur)
            same = None if m in _MODEL_LOSSES else next(
                (prev for prev, a, ph in seen if torch.equal(a, adv_eff) and len(ph) == len(phases)
                 and all(torch.equal(x, y) for x, y in zip(ph, phases))), None)
            seen.append((m, adv_eff, phases) if m not in _MODEL_LOSSES else (m, torch.full_like(adv, math.nan), []))
            entry = {"kind": kinds[m], "effective_weight": per_bucket_dict(bucket_means(c, p_old, mask))}
            if same is not None:  # identical first step (e.g. Archer, KL-Cov vs GRPO): identical numbers
                results[m], moved[m] = {**results[same], **entry, "same_update_as": same}, moved[same]
                continue
            log.info("compare-methods: %s", m)
            snap.restore()
            grads = None
            if m in _MODEL_LOSSES:
                cfg, req = method_config(m, token_cfg), method_stats(m, token_cfg, batch.temperature)
                grads = lambda masks, cfg=cfg, req=req: objective_gradients(  # noqa: E731
                    policy, batch, old, adv, cfg, masks, req, micro_batch_size)
            numbers, new = _method_update(policy, batch, old, adv_eff, phases, idx, optimizer, lr, micro_batch_size,
                                          grads)
            moved[m] = right_way(old, new, adv, mask)
            results[m] = {**entry, **numbers, **moved_counts(moved[m], idx, adv, mask)}
    finally:
        snap.restore()
    for m in (m for m in results if m != "grpo" and "grpo" in moved):
        results[m]["vs_grpo"] = discordant(moved[m], moved["grpo"], idx, adv, mask)
    return {"optimizer": optimizer, "lr": lr, "alpha": alpha, "eta": eta,
            "token_method": {k: v for k, v in vars(token_cfg).items() if k != "name"},
            "advantage_source": batch.advantage_source, "methods": results,
            "support": support(idx, adv, mask, batch.group_ids),
            "tokens_per_bucket": per_bucket_dict(torch.stack([(idx[mask.bool()] == b).sum() for b in
                                                              range(NUM_BUCKETS)]).float())}


@torch.no_grad()
def _top_k(policy, batch, name: str, token_cfg: TokenMethodConfig, micro_batch_size: int) -> Tensor:
    """π_θ's top-K log-probs ``[B, R, K]`` (detached) for a model loss's sampled-token share of A'."""
    req = StatsRequest(top_k=method_stats(name, token_cfg, batch.temperature).top_k)
    was = policy.training
    policy.eval()
    try:
        tops = [policy(batch.input_ids[lo:lo + micro_batch_size], batch.attention_mask[lo:lo + micro_batch_size],
                       batch.prompt_len, batch.temperature, False, stats=req)[2].top_log_probs
                for lo in range(0, len(batch), micro_batch_size)]
    finally:
        policy.train(was)
    return torch.cat(tops)


def markdown_table(result: dict, bucket: str = BUCKET_NAMES[-1]) -> str:
    """One row per method: the numbers of one bucket (default the highest, (.75, 1]); each direction fraction
    with its count k / n (tokens of one batch: not independent samples)."""
    def f(v, fmt="{:.3f}"):
        return "–" if v is None else fmt.format(v)

    def frac(r, key, count, sign):
        n = result.get("support", {}).get(sign, {}).get("tokens", {}).get(bucket)
        k = r.get(count, {}).get(bucket)
        return f(r[key][bucket]) + ("" if n is None or k is None else f" ({k}/{n})")

    lines = [f"| method | weight vs GRPO | mass share | norm share | A>0 rose | A<0 fell | mean Δp (A>0) | "
             f"mean Δp (A<0) |", "|---|---|---|---|---|---|---|---|"]
    for m, r in result["methods"].items():
        lines.append(f"| {m} | {f(r['effective_weight'][bucket])} | {f(r['mass_share'][bucket])} | "
                     f"{f(r['norm_share'][bucket])} | {frac(r, 'pos_frac', 'pos_rose', 'pos')} | "
                     f"{frac(r, 'neg_frac', 'neg_fell', 'neg')} | "
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
