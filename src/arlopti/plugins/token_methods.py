"""Token-level methods: AR's and Lopti's rivals and partners (``algorithm.token_method.name``).

Each method is a pure function ``fn(ctx, cfg) -> TokenShaping`` registered in
:data:`~arlopti.config.registries.TOKEN_METHODS`. ``ctx`` (:class:`TokenContext`) holds, for one
micro-batch and one Lopti phase, **detached**: the current log-probs logπ_θ, the rollout-time
logπ_old, the advantages A (after the estimator, AR and the phase mask), the per-token entropy H of
the current policy (at the rollout temperature, from the learner's fused kernel), the response
mask and the phase mask, and the forward's full-distribution statistics where a method needs them
(``dist``: :class:`arlopti.ops.tile_stats.TokenStats`; Lp-Reg's proxy log-probs).
``cfg`` is a :class:`arlopti.config.TokenMethodConfig`. The population
``P`` a method ranks or averages over is ``ctx.population`` = response mask ∧ phase mask (without
Lopti: every valid token).

A :class:`TokenShaping` says how :func:`arlopti.algorithms.grpo_objective` changes the loss; every
field is optional (None: unchanged) and detached:

* ``adv_weight`` w_t: A_t ← w_t·A_t before the policy loss;
* ``keep`` k_t (bool): the token's policy-gradient loss is multiplied by k_t, so a dropped token has
  zero loss and **zero gradient** but stays in the normaliser (verl's Clip-Cov ``corr`` and TRL's
  ``entropy_mask`` both do exactly this);
* ``clip_low`` / ``clip_high``: per-token PPO clip ε (tensors; every loss accepts them);
* ``kl_weight`` c_t: the token's β·KL(π‖π_ref) term times c_t;
* ``abs_log_ratio_coef`` κ_t: + κ_t·|logπ_θ,t − logπ_old,t| added to the token's policy loss (KL-Cov);
* ``proxy_kl_coef`` κ_t with ``proxy_log_probs`` logπ′_t: + κ_t·KL_lv(π_θ ‖ π′) added to the token's policy
  loss, with d = logπ′_t − logπ_θ,t and KL_lv = min(e^d − d − 1, 10) (Lp-Reg's ``low_var_kl``).

Reproducibility notes. Everything a method computes is per micro-batch (the objective sees one
micro-batch), as verl's Clip-Cov/KL-Cov are (they run inside the per-micro-batch policy loss); TRL's
top-entropy threshold is gathered over ranks, ours is per micro-batch and rank (identical with one
micro-batch per step on one rank). Clip-Cov's random choice uses a fixed-seed generator, so a
micro-batch's selection is a deterministic function of its tensors.

Composition (checked in :func:`arlopti.config.rules._validate_algorithm`): every method composes with
every estimator and with AR except ``reverse`` (AR's mirror image: the two weights cancel; use
one); with Lopti every method composes (it then acts within each phase's tokens) except
``top_entropy``: both are masks that decide which tokens learn, by different criteria, and the
top-ρ-entropy tokens are mostly low-probability ones, so Lopti's high phase would be left almost
empty — the composition has no meaning. ``clip_cov`` and ``lp_reg`` need ``policy_loss=ppo_clip``
(Clip-Cov's candidates exclude the tokens PPO already clipped; Lp-Reg lifts PPO's clip on the tokens
it regularises); ``archer`` refuses the losses that read no per-token PPO bounds (``gspo``: one
sequence ratio; ``dppo_*``: divergence thresholds; ``sapo``: no clip).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arlopti.config.registries import TOKEN_METHODS
from arlopti.ops.tile_stats import TokenStats


@dataclass(frozen=True)
class TokenContext:
    """Detached per-token inputs of a method (module docstring). All ``[B, T]``."""

    log_probs: Tensor
    old_log_probs: Tensor
    advantages: Tensor
    response_mask: Tensor
    phase_mask: Tensor
    entropy: Tensor | None = None
    clip_low: float = 0.2
    clip_high: float = 0.24
    dist: TokenStats | None = None

    @property
    def population(self) -> Tensor:
        """bool ``[B, T]``: valid tokens of this phase, what a method ranks and averages over."""
        return self.response_mask.bool() & self.phase_mask.bool()

    def need_entropy(self, method: str) -> Tensor:
        if self.entropy is None:
            raise ValueError(f"algorithm.token_method.name={method} needs the per-token entropy "
                             "(shaping_for(..., Forward(entropy=...)))")
        return self.entropy.detach().float()

    def need_stat(self, method: str, name: str) -> Tensor:
        """Statistic ``name`` of :attr:`dist` (detached float), or a clear error naming ``method``."""
        value = None if self.dist is None else getattr(self.dist, name)
        if value is None:
            raise ValueError(f"algorithm.token_method.name={method} needs the forward's {name} "
                             f"(shaping_for(..., Forward(dist=TokenStats with {name})))")
        return value.detach().float()


@dataclass(frozen=True)
class TokenShaping:
    """How one method reshapes the loss (module docstring); None fields change nothing."""

    adv_weight: Tensor | None = None
    keep: Tensor | None = None
    clip_low: Tensor | None = None
    clip_high: Tensor | None = None
    kl_weight: Tensor | None = None
    abs_log_ratio_coef: Tensor | None = None
    proxy_kl_coef: Tensor | None = None
    proxy_log_probs: Tensor | None = None


def make_context(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor,
                 phase_mask: Tensor, entropy: Tensor | None = None, clip_low: float = 0.2,
                 clip_high: float = 0.24, dist: TokenStats | None = None) -> TokenContext:
    """A :class:`TokenContext` with every tensor detached."""
    return TokenContext(log_probs.detach().float(), old_log_probs.detach().float(), advantages.detach().float(),
                        response_mask.detach(), phase_mask.detach(), None if entropy is None else entropy.detach(),
                        clip_low, clip_high, None if dist is None else dist.map(lambda t: t.detach()))


def token_shaping(ctx: TokenContext, cfg) -> TokenShaping:
    """Run method ``cfg.name`` (``none``: no shaping)."""
    return TOKEN_METHODS.get(cfg.name)(ctx, cfg)


def effective_weight(ctx: TokenContext, shaping: TokenShaping) -> Tensor:
    """The multiplier of each token's policy-gradient term relative to GRPO at the ratio 1:
    ``adv_weight · keep`` (1 where a field is None). Clip bounds, KL weights and the KL-Cov
    penalty change the gradient only off-policy or through other terms, so they do not enter."""
    w = torch.ones_like(ctx.log_probs)
    if shaping.adv_weight is not None:
        w = w * shaping.adv_weight.float()
    if shaping.keep is not None:
        w = w * shaping.keep.float()
    return w


@TOKEN_METHODS.register("none")
def no_method(ctx: TokenContext, cfg) -> TokenShaping:
    """No token method: plain GRPO (or AR / Lopti) token treatment."""
    return TokenShaping()


def _covariance(ctx: TokenContext) -> Tensor:
    """cov_t = (A_t − mean_P A)·(logπ_θ,t − mean_P logπ_θ) on the population P, −inf elsewhere
    (arXiv 2505.22617 §4, the centred product whose batch mean is Cov(logπ, A); verl's
    ``compute_policy_loss_clip_cov``/``_kl_cov`` compute it on the detached current log-probs)."""
    pop = ctx.population
    n = pop.sum().clamp(min=1)
    adv_mean = (ctx.advantages * pop).sum() / n
    lp_mean = (ctx.log_probs * pop).sum() / n
    cov = (ctx.advantages - adv_mean) * (ctx.log_probs - lp_mean)
    return torch.where(pop, cov, torch.full_like(cov, float("-inf")))


def _count(ratio: float, n: int) -> int:
    """k = max(1, ⌊ratio·n⌋): how many tokens Clip-Cov / KL-Cov select (verl: the same rule)."""
    return max(1, int(ratio * n))


@TOKEN_METHODS.register("clip_cov")
def clip_cov(ctx: TokenContext, cfg) -> TokenShaping:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, §4.3 eq. 11; restated from verl's
    ``compute_policy_loss_clip_cov`` in ``verl/trainer/ppo/core_algos.py``, which we read).

    With cov_t from :func:`_covariance` over P, the candidates are the tokens of P that PPO has not
    already clipped (−A·clip(ρ, 1 − ε_low, 1 + ε_high) > −A·ρ is verl's ``clip_by_origin``) and whose
    covariance lies strictly inside (``clip_cov_lb``, ``clip_cov_ub``) (verl: 1 and 5). Of them,
    k = max(1, ⌊``cov_ratio``·|P|⌋) (verl's default ratio 2e-4) are drawn uniformly at random
    (verl: ``torch.randperm``; ours: a generator seeded with 0, so the draw is a deterministic
    function of the micro-batch) and **detached**: ``keep`` = False, zero loss and zero gradient,
    still counted by the normaliser (verl multiplies the token's loss by ``corr = 0``).
    With all-zero advantages cov ≡ 0 < lb: nothing is detached."""
    pop = ctx.population
    n = int(pop.sum())
    keep = torch.ones_like(pop)
    if n == 0:
        return TokenShaping(keep=keep)
    ratio = torch.exp((ctx.log_probs - ctx.old_log_probs).clamp(-20.0, 20.0))
    a = ctx.advantages
    clipped = (-a * ratio.clamp(1.0 - ctx.clip_low, 1.0 + ctx.clip_high)) > (-a * ratio)
    cov = _covariance(ctx)
    cand = pop & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    idx = cand.flatten().nonzero().squeeze(-1)
    if idx.numel() > 0:
        perm = torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(0)).to(idx.device)
        chosen = idx[perm[:min(_count(cfg.cov_ratio, n), idx.numel())]]
        keep = keep.flatten().clone()
        keep[chosen] = False
        keep = keep.view_as(pop)
    return TokenShaping(keep=keep)


@TOKEN_METHODS.register("kl_cov")
def kl_cov(ctx: TokenContext, cfg) -> TokenShaping:
    """KL-Cov (arXiv 2505.22617, §4.3 eq. 12; restated from verl's ``compute_policy_loss_kl_cov``).

    The k = max(1, ⌊``cov_ratio``·|P|⌋) tokens of P with the **largest** cov_t (:func:`_covariance`)
    get + ``kl_cov_coef``·|logπ_θ,t − logπ_old,t| added to their policy loss (verl: ``ppo_kl_coef``
    1, ratio 2e-4). Ties: a stable descending sort, the earlier token (row-major) first (verl's
    ``torch.topk`` leaves the order of ties unspecified). With all-zero advantages cov ≡ 0 and k
    tokens are still penalised (verl does the same); the penalty's gradient is 0 at ρ = 1 anyway.

    One deviation, stated: verl's KL-Cov uses the **unclipped** surrogate −A·ρ on every token;
    ours keeps the configured policy loss (PPO clip). To match verl set
    ``algorithm.clip_low=1 algorithm.clip_high=1e9 algorithm.dual_clip=null``."""
    pop = ctx.population
    n = int(pop.sum())
    coef = torch.zeros_like(ctx.log_probs)
    if n == 0:
        return TokenShaping(abs_log_ratio_coef=coef)
    cov = _covariance(ctx).flatten()
    order = torch.sort(cov, descending=True, stable=True).indices
    chosen = order[:_count(cfg.cov_ratio, n)]
    coef = coef.flatten().clone()
    coef[chosen] = cfg.kl_cov_coef
    return TokenShaping(abs_log_ratio_coef=coef.view_as(ctx.log_probs))


@TOKEN_METHODS.register("top_entropy")
def top_entropy(ctx: TokenContext, cfg) -> TokenShaping:
    """High-entropy minority tokens (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939,
    §5 eq. 6; restated from TRL's ``GRPOTrainer.get_high_entropy_mask`` with
    ``top_entropy_quantile`` in ``trl/trainer/grpo_trainer.py``).

    τ = the (1 − ρ)-quantile (``torch.quantile``, linear interpolation, as TRL) of H over P, with
    ρ = ``entropy_top`` (the paper: 0.2); ``keep`` = H_t ≥ τ. Only those tokens keep a policy
    gradient; the others are zeroed in the loss but stay in the normaliser (TRL multiplies the
    per-token loss by the mask). Ties at τ are all kept, so more than ρ·|P| tokens may be kept;
    ρ = 1 keeps every token. Tokens outside P keep k = 1 (they carry no advantage anyway)."""
    h = ctx.need_entropy("top_entropy")
    pop = ctx.population
    if not bool(pop.any()):
        return TokenShaping(keep=torch.ones_like(pop))
    tau = torch.quantile(h[pop], 1.0 - cfg.entropy_top)
    return TokenShaping(keep=(h >= tau) | ~pop)


@TOKEN_METHODS.register("archer")
def archer(ctx: TokenContext, cfg) -> TokenShaping:
    """Archer, dual-token constraints (Wang et al. 2025, arXiv 2507.15778, §3; restated from
    ArcherCodeR's ``dp_actor.py`` (read in the fork Jinxiaolong1129/ArcherCodeR: per-response
    ``torch.nanquantile(entropy, q, dim=-1)``; the per-group clip ratios and
    ``high_entropy_kl_loss_scale_coef`` of its scripts).

    Per response, q_b = the ``archer_quantile``-quantile (0.8) of H over its valid tokens
    (linear interpolation). High-entropy ("reasoning") tokens: H_t > q_b (strict, as ArcherCodeR);
    the rest are low-entropy ("knowledge") tokens. Per token:
    ε_low = ε_high = ``archer_clip_high_entropy`` (0.5) on high-entropy tokens,
    ``archer_clip_low_entropy`` (0.2) on low-entropy ones; KL weight
    ``archer_high_entropy_kl`` (0: ArcherCodeR's scripts drop the KL on high-entropy tokens) on
    high-entropy tokens, 1 on the others. No token is masked (Archer's point against isolation).

    Deviation, stated: ArcherCodeR normalises each group's KL by that group's own token count; ours
    uses the objective's normaliser (all valid tokens), so per-token weights compose with the rest."""
    h = ctx.need_entropy("archer")
    valid = ctx.response_mask.bool()
    q = torch.nanquantile(torch.where(valid, h, torch.full_like(h, float("nan"))), cfg.archer_quantile, dim=-1,
                          keepdim=True)
    high = valid & (h > q)
    eps = torch.where(high, torch.full_like(h, cfg.archer_clip_high_entropy),
                      torch.full_like(h, cfg.archer_clip_low_entropy))
    kl_w = torch.where(high, torch.full_like(h, cfg.archer_high_entropy_kl), torch.ones_like(h))
    return TokenShaping(clip_low=eps, clip_high=eps.clone(), kl_weight=kl_w)


@TOKEN_METHODS.register("tr_grpo")
def tr_grpo(ctx: TokenContext, cfg) -> TokenShaping:
    """TR-GRPO, token-regulated GRPO (arXiv 2511.00066): a token weight that rises with the model's
    own probability of the token, p_t = exp(sg[logπ_θ,t]):

        w_t = clip(α·(σ(p_t / τ) − μ), w_min, w_max),   A_t ← w_t·A_t

    (α = ``tr_alpha``, τ = ``tr_tau``, μ = ``tr_mu``, bounds ``tr_min``/``tr_max``; σ the sigmoid).
    NOT CONFIRMED: only the paper's abstract was readable here ("token-level weights positively
    correlated with the model's predicted probability", "a monotone probability shaping
    function"); this sigmoid form is our restatement of the paper's shaping and no peer
    implementation was found, so the form and every default (α 4, τ 1, μ 0.5, [0, 1], ours: w ≈ p
    for small p, 0.92 at p = 1) must be checked against the paper before quoting results."""
    p = torch.exp(ctx.log_probs)
    w = (cfg.tr_alpha * (torch.sigmoid(p / cfg.tr_tau) - cfg.tr_mu)).clamp(cfg.tr_min, cfg.tr_max)
    return TokenShaping(adv_weight=w)


@TOKEN_METHODS.register("reverse")
def reverse_weighting(ctx: TokenContext, cfg) -> TokenShaping:
    """Reverse weighting, AR's mirror image (our ablation):

        A_t ← [α·(1 − p_old,t) + (1 − α)]·A_t,   α = ``reverse_alpha`` ∈ [0, 1]

    It up-weights low-probability tokens relative to high ones (weight in [1 − α, 1], 1 at
    p_old = 0), where AR (α·p_old + 1 − α) up-weights high ones. The Δlog p line of work
    (arXiv 2603.22117) is cited by the issue for this direction; we could not read it, so this is
    stated as our ablation, not that paper's rule."""
    p_old = torch.exp(ctx.old_log_probs)
    return TokenShaping(adv_weight=cfg.reverse_alpha * (1.0 - p_old) + (1.0 - cfg.reverse_alpha))


def lp_reg_selection(ctx: TokenContext, sign: int, share: float) -> Tensor:
    """bool ``[B, T]``: Lp-Reg's candidates of one sign of A — of the n tokens of P with sign(A) = ``sign``,
    the k = max(1, ⌊share·n⌋) with the lowest logπ_θ (stable ascending sort: ties, the earlier token),
    and none unless k > 1 (Lp-Reg's ``if logp_k > 1``, which is also how its scripts switch a side off)."""
    pop = ctx.population & ((ctx.advantages > 0) if sign > 0 else (ctx.advantages < 0))
    n = int(pop.sum())
    k = max(1, int(n * share))
    chosen = torch.zeros_like(pop)
    if n == 0 or k <= 1:
        return chosen
    lp = torch.where(pop, ctx.log_probs, torch.full_like(ctx.log_probs, float("inf"))).flatten()
    order = torch.sort(lp, stable=True).indices[:k]
    return chosen.flatten().index_fill(0, order, True).view_as(pop)


@TOKEN_METHODS.register("lp_reg")
def lp_reg(ctx: TokenContext, cfg) -> TokenShaping:
    """Lp-Reg, low-probability regularisation (arXiv 2510.03222; restated from CarlanLark/Lp-Reg-dev's
    ``compute_policy_loss_lp_reg`` in ``verl/trainer/ppo/core_algos.py`` and ``apply_min_p`` /
    ``update_policy`` in ``verl/workers/actor/dp_actor.py``, read in the code index).

    The proxy π′ is the policy with its noise removed: min-p filtering drops every token with
    p < κ·p_max and renormalises the rest (κ = ``lp_reg_min_p``, its scripts 0.02); ``dist.min_p_log_prob``
    is logπ′ of the sampled token (−inf where the token is itself noise). Among the tokens of P with
    A < 0, the ``lp_reg_neg_share`` (0.01) with the lowest logπ_θ (:func:`lp_reg_selection`; likewise
    ``lp_reg_pos_share`` for A > 0, 0 in its scripts) are the "reasoning sparks" at risk; those with
    logπ_θ < logπ′ (kept by the filter and below their proxy) lose PPO's clip — their loss is −A·ρ,
    unclipped (per-token ε_low = 1, ε_high = ∞) — and gain ``lp_reg_coef``·KL_lv(π_θ ‖ π′) (the
    module docstring's ``proxy_kl_coef``), whose gradient (1 − π′/π)·∇logπ < 0 raises them toward
    the proxy against the negative advantage. A token the filter calls noise is left to PPO.

    Deviations, stated: Lp-Reg filters the raw logits before dividing by the temperature, so its
    threshold is κ·p_max at T = 1; the learner asks the fused pass for exactly that
    (``StatsRequest(min_p_log=log κ / T)``; its scripts run at T = 1, where the two agree). Its scripts
    take the proxy from the old policy (``minp_old_log_prob=True``, one more no-grad pass); here it
    comes from the current forward (its code's other path, ``minp_old_log_prob=False``, which runs an
    extra forward with the current weights) — the same on a step's first optimizer step, within one
    step's drift after. Its lowest-p selection is per micro-batch, as here. The dual-clip, if set, still
    caps A < 0 tokens (Lp-Reg's loss has none: ``kk_lp_reg`` sets ``dual_clip: null``)."""
    proxy = ctx.need_stat("lp_reg", "min_p_log_prob")
    chosen = lp_reg_selection(ctx, -1, cfg.lp_reg_neg_share) | lp_reg_selection(ctx, 1, cfg.lp_reg_pos_share)
    chosen = chosen & (ctx.log_probs < proxy)
    coef = torch.where(chosen, torch.full_like(proxy, cfg.lp_reg_coef), torch.zeros_like(proxy))
    low = torch.where(chosen, torch.ones_like(proxy), torch.full_like(proxy, ctx.clip_low))
    high = torch.where(chosen, torch.full_like(proxy, float("inf")), torch.full_like(proxy, ctx.clip_high))
    return TokenShaping(clip_low=low, clip_high=high, proxy_kl_coef=coef,
                        proxy_log_probs=torch.where(chosen, proxy, ctx.log_probs))
