"""The advantage estimators beyond GRPO, Dr.GRPO and RLOO: REINFORCE++ and the optimal token baseline.

Registered in ``ADVANTAGE_ESTIMATORS`` (``algorithm.advantage``) with the core's signature
(:mod:`arlopti.algorithms.advantages`): token rewards ``[B, T]`` in, token advantages out.

* ``reinforce_pp``          G_t = Σ_{k≥t} γ^{k−t} r_k (the return, reset after the response's last
                            valid token; environment tokens inside a multi-turn episode pass it on
                            unchanged, :func:`discounted_returns`), then whitened over every valid token of the batch:
                            (G − μ) / sqrt(σ² + 1e-8), μ and σ² (unbiased, n/(n−1)) over all ranks.
                            Restates ``compute_reinforce_plus_plus_outcome_advantage`` and
                            ``masked_whiten``/``masked_var`` (zhyang2226/AR-Lopti,
                            ``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``).
                            γ = 1 gives the outcome reward on every token. No group baseline.
* ``reinforce_pp_baseline`` s_i − mean_g (group of one: mean 0), broadcast to the tokens, then
                            whitened as above (verl's current ``core_algos``,
                            ``compute_reinforce_plus_plus_baseline_outcome_advantage``).
* ``otb``                   the optimal token baseline: a baseline per group and position, weighted by the
                            accumulated squared logit-gradient norm (:func:`otb_advantages`). The only
                            estimator that reads the old policy (``old``: :class:`OldPolicyStats`), and
                            the only one with a setting of its own, ``zero_tail`` (:func:`estimator_options`).

Whitening uses the **global** batch: ``reduce`` sums a tensor over data-parallel ranks (identity on
one process), so 1 rank and N ranks give the same advantages. ``eps`` (``algorithm.adv_eps``) is
the group estimators'; the whitening's 1e-8 is fixed, as in the official code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.algorithms.advantages import (OldPolicyStats, Reduce, broadcast_to_tokens, grpo_advantages, local_sum,
                                           sequence_scores)
from arlopti.config.registries import ADVANTAGE_ESTIMATORS


def masked_whiten(values: Tensor, mask: Tensor, reduce: Reduce = local_sum) -> Tensor:
    """(x − μ) · rsqrt(σ² + 1e-8) with μ = Σx·m / Σm and the unbiased σ² = Σ(x − μ)²·m / Σm · n/(n−1),
    n = Σm, every sum taken over all ranks through ``reduce`` (official ``masked_whiten``, which
    also raises for n < 2). Not re-masked: callers multiply by the mask."""
    m = mask.to(torch.float64)
    x = values.to(torch.float64)
    n = float(reduce(m.sum()))
    if n < 2:
        raise ValueError(f"whitening needs at least 2 valid tokens in the batch over all ranks, got {n:g}")
    mean = reduce((x * m).sum()) / n
    var = reduce(((x - mean) ** 2 * m).sum()) / n * (n / (n - 1))
    return ((x - mean) * torch.rsqrt(var + 1e-8)).to(values.dtype)


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ·G_{t+1} from the end, the running return reset to 0 after each response's last
    valid token (official loop: after EOS nothing flows back into the response). A masked position
    before it (an environment token inside a multi-turn episode) passes the return on unchanged, so a
    later turn's reward reaches the earlier turns as if the environment's tokens were not there; the
    returns there are masked out by the callers. With a mask without holes: the official loop."""
    mask = response_mask.to(token_rewards.dtype)
    inside = mask.flip(-1).cummax(-1).values.flip(-1)  # 1 up to and including the last valid token
    hole = (inside > 0) & (mask == 0)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(hole[:, t], running, token_rewards[:, t] + gamma * running)
        returns[:, t] = running
        running = running * inside[:, t]
    return returns


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor | None = None, *,
                            eps: float = 1e-6, gamma: float = 1.0, reduce: Reduce = local_sum,
                            old: OldPolicyStats | None = None) -> Tensor:
    """REINFORCE++ (module docstring): whitened discounted returns; ``group_ids`` and ``eps`` unused."""
    mask = response_mask.to(torch.float32)
    returns = discounted_returns(token_rewards.to(torch.float32), mask, gamma)
    return masked_whiten(returns, mask, reduce) * mask


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *,
                                     eps: float = 1e-6, gamma: float = 1.0, reduce: Reduce = local_sum,
                                     old: OldPolicyStats | None = None) -> Tensor:
    """REINFORCE++ with a group-mean baseline (module docstring); ``eps`` and ``gamma`` unused."""
    mask = response_mask.to(torch.float32)
    centred = grpo_advantages(sequence_scores(token_rewards, mask), group_ids, norm_by_std=False)
    return masked_whiten(broadcast_to_tokens(centred, mask), mask, reduce) * mask


#: verl's ``epsilon`` default of ``compute_optimal_token_baseline_advantage`` (not ``algorithm.adv_eps``).
OTB_EPS = 1e-8


def otb_token_weights(old: OldPolicyStats, response_mask: Tensor) -> Tensor:
    """W_t = Σ_{j ≤ t} m_j·(1 − 2π_old(o_j) + Σ_v π_old(v)²): each step's term is ‖e_{o_j} − π_old‖², the squared
    norm of ∇_z logπ(o_j) — the quantity behind AR's (1 − p) bound — accumulated along the response."""
    if old is None or old.sum_p2 is None:
        raise ValueError("algorithm.advantage=otb needs the old policy's log-probs and sum of p^2 "
                         "(OldPolicyStats(log_probs, sum_p2) from the old-log-prob pass)")
    mask = response_mask.to(torch.float64)
    w = 1.0 - 2.0 * torch.exp(old.log_probs.detach().double()) + old.sum_p2.detach().double()
    return (w * mask).cumsum(-1)


def otb_zero_tail(response_mask: Tensor, inverse: Tensor, groups: int) -> Tensor:
    """Bool ``[B, T]``: where verl's ``handle_zero_tail`` sets OTB's baseline to 0. In a group whose longest
    response is unique, its positions from the second-longest response's length on (length: the last
    valid position + 1, the token count of a single-turn response, which is what verl measures); nowhere
    in a group with a tie for the longest. ``inverse``: each row's group in ``[0, groups)``."""
    pos = torch.arange(response_mask.shape[1], device=response_mask.device)
    span = ((response_mask > 0) * (pos + 1)).amax(-1) if response_mask.numel() else response_mask.new_zeros(
        response_mask.shape[0], dtype=torch.long)
    span = span.long()
    longest = torch.zeros(groups, dtype=torch.long, device=span.device).scatter_reduce_(0, inverse, span, "amax")
    at_max = span == longest[inverse]
    ties = torch.zeros(groups, dtype=torch.long, device=span.device).index_add_(0, inverse, at_max.long())
    second = torch.zeros(groups, dtype=torch.long, device=span.device).scatter_reduce_(
        0, inverse, torch.where(at_max, torch.zeros_like(span), span), "amax")
    unique = at_max & (ties[inverse] == 1) & (span > second[inverse])
    return unique.unsqueeze(-1) & (pos >= second[inverse].unsqueeze(-1))


@ADVANTAGE_ESTIMATORS.register("otb")
def otb_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
                   gamma: float = 1.0, reduce: Reduce = local_sum, old: OldPolicyStats | None = None,
                   zero_tail: bool = True) -> Tensor:
    """Optimal token baseline (Li et al., arXiv 2602.07078; restated from verl's
    ``compute_optimal_token_baseline_advantage`` in ``verl/trainer/ppo/core_algos.py`` and its
    ``docs/algo/otb.md``)::

        G_t  = Σ_{k ≥ t} m_k·r_k                     (reward-to-go, undiscounted)
        W_t  = :func:`otb_token_weights`              (π_old at the rollout temperature)
        B_t  = Σ_{i ∈ g} G_i,t·W_i,t·m_i,t / (Σ_{i ∈ g} W_i,t·m_i,t + 1e-8)    per group g and position t
        A_t  = (G_t − B_t)·m_t

    A response's advantage at position t is its return minus a W-weighted mean of its group's returns
    at t: a response whose tokens so far were uncertain (large W) pulls the baseline toward its own
    return. No std normalisation. A group of one has no baseline (A = G, as verl). ``eps`` and ``gamma``
    are not read (OTB's 1e-8 is verl's default, :data:`OTB_EPS`); the group statistics are per rank
    (groups are whole on a rank), so ``reduce`` is not needed.

    **The zero tail** (``zero_tail``, ``algorithm.otb_zero_tail``; verl's ``handle_zero_tail``, on by
    default since verl PR #5380, in v0.7.1 and later): beyond the second-longest response of a group only
    its unique longest response has tokens, so there B_t is computed from that response alone and equals
    its own return, G·W / (W + 1e-8): A_t ≈ 0, and those tokens get no gradient. With ``zero_tail`` the
    baseline there is 0 instead (:func:`otb_zero_tail`), A_t = G_t, plain REINFORCE on the tail; without
    it, A_t = G_t − B_t ≈ 0. The two differ by up to |G| on those tokens.

    Not built: verl's optional rescaling of W by the rollout-correction weight squared. Positions are
    response positions; in a multi-turn episode the environment's tokens (mask 0) add nothing to W but
    still align the responses by position, and the zero tail starts at the second-longest response's
    last valid position + 1 (verl's ``tir_optimal_token_baseline`` compacts the tokens first and counts
    them instead)."""
    mask = response_mask.to(torch.float64)
    returns = (token_rewards.double() * mask).flip(-1).cumsum(-1).flip(-1)
    w = otb_token_weights(old, response_mask) * mask
    _, inverse = torch.unique(group_ids, return_inverse=True)
    k = int(inverse.max()) + 1 if inverse.numel() else 0
    num = torch.zeros(k, mask.shape[1], dtype=torch.float64, device=mask.device).index_add_(0, inverse, returns * w)
    den = torch.zeros_like(num).index_add_(0, inverse, w)
    size = torch.zeros(k, dtype=torch.float64, device=mask.device).index_add_(0, inverse, torch.ones_like(mask[:, 0]))
    baseline = torch.where(size[inverse].unsqueeze(-1) > 1, (num / (den + OTB_EPS))[inverse], torch.zeros_like(w))
    if zero_tail:
        baseline = torch.where(otb_zero_tail(response_mask, inverse, k), torch.zeros_like(baseline), baseline)
    return ((returns - baseline) * mask).to(torch.float32)


def estimator_options(algorithm) -> dict:
    """The keyword settings the run's estimator takes beyond the common ones (``eps``, ``gamma``, ``reduce``,
    ``old``): OTB's ``zero_tail`` (``algorithm.otb_zero_tail``); none for the others."""
    return {"zero_tail": algorithm.otb_zero_tail} if algorithm.advantage == "otb" else {}
