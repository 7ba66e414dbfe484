"""Full-distribution statistics of each row, folded tile by tile inside the fused log-prob pass.

For a row with tempered logits ``z = (h·Wᵀ + b) / T``, ``p = softmax(z)`` and ``logZ = logsumexp(z)``,
:func:`arlopti.ops.logprobs.token_logprobs` (``stats=StatsRequest(...)``) returns beside ``log p[target]``:

* ``sum_p2``          ``Σ_v p_v²`` — no gradient. OTB's per-token weight ``1 − 2p_t + Σ p²`` is the squared
                      norm of ``∇_z log p_t = e_t − p`` (verl's ``calculate_sum_pi_squared_from_logits``
                      computes it from full logits as ``exp(logsumexp(2z) − 2 logZ)``).
* ``top_log_probs``   the ``K`` largest ``log p_v`` of the row, largest first, and ``top_ids`` their token ids
                      (``torch.topk`` order; the order of exactly tied logits is unspecified). Differentiable:
                      ``∂ log p_j / ∂z = e_j − p``, which the fused backward folds into the same tiles.
* ``kept_log_mass``   ``log M = log Σ_{v: z_v ≥ max z + δ} p_v``, the mass a min-p filter with log-threshold
                      ``δ = min_p_log ≤ 0`` keeps, and ``min_p_log_prob``, the target's log-probability under
                      the filtered, renormalised distribution: ``log p_target − log M`` where the target is
                      kept, ``−inf`` where it is filtered out (Lp-Reg's proxy) — no gradient. The filter needs
                      the row's maximum first, so the fused pass sweeps the row's tiles a second time.

Per tile of columns the fused forward has ``z`` and the tile-local ``L = log_softmax(z)``; the tiles of a row
are merged exactly: the top-K by a running top-K of the tiles' top-Ks, ``Σ p²`` by the online log-sum-exp's
weights (:class:`arlopti.ops.logprobs._OnlineStats`: ``Σ p² = Σ_t w_t² q_t / s²`` with
``q_t = Σ_{v∈t} e^{2L_v}``), the kept mass by a running ``logaddexp`` in the second sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class StatsRequest:
    """Which statistics to compute (module docstring); the default asks for none."""

    sum_p2: bool = False
    top_k: int = 0
    min_p_log: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"StatsRequest.top_k must be an int >= 0, got {self.top_k!r}")
        if self.min_p_log is not None and not self.min_p_log <= 0:
            raise ValueError(f"StatsRequest.min_p_log must be <= 0 (a log-ratio to the row's max), "
                             f"got {self.min_p_log!r}")

    def __bool__(self) -> bool:
        return self.sum_p2 or self.top_k > 0 or self.min_p_log is not None

    def merge(self, other: "StatsRequest | None") -> "StatsRequest":
        """Everything either request asks for (the larger K; one min-p threshold at most)."""
        if other is None:
            return self
        if None not in (self.min_p_log, other.min_p_log) and self.min_p_log != other.min_p_log:
            raise ValueError(f"two different min-p thresholds requested: {self.min_p_log} and {other.min_p_log}")
        return StatsRequest(self.sum_p2 or other.sum_p2, max(self.top_k, other.top_k),
                            self.min_p_log if self.min_p_log is not None else other.min_p_log)


class TokenStats(NamedTuple):
    """The statistics of each row (module docstring); a field not requested is None. A NamedTuple, so
    that module hooks (FSDP2) see its tensors."""

    sum_p2: Tensor | None = None
    top_log_probs: Tensor | None = None
    top_ids: Tensor | None = None
    kept_log_mass: Tensor | None = None
    min_p_log_prob: Tensor | None = None

    def map(self, fn) -> "TokenStats":
        """``fn`` applied to every tensor that is there."""
        return TokenStats(*(None if t is None else fn(t) for t in self))


def stats_from_logits(z: Tensor, request: StatsRequest, targets: Tensor, logz: Tensor | None = None) -> TokenStats:
    """The reference: every statistic from full tempered logits ``z [N, V]`` and the targets ``[N]``
    (fp32, autograd through ``top_log_probs``)."""
    logz = torch.logsumexp(z, dim=-1) if logz is None else logz
    out = {}
    if request.sum_p2:
        out["sum_p2"] = torch.exp(torch.logsumexp(2 * z.detach(), dim=-1) - 2 * logz.detach())
    if request.top_k:
        ids = torch.topk(z.detach(), request.top_k, dim=-1).indices
        out["top_log_probs"] = z.gather(-1, ids) - logz.unsqueeze(-1)
        out["top_ids"] = ids
    if request.min_p_log is not None:
        zd, lz = z.detach(), logz.detach()
        thr = zd.amax(dim=-1) + request.min_p_log
        mass = (torch.logsumexp(zd.masked_fill(zd < thr.unsqueeze(-1), -math.inf), dim=-1) - lz).clamp(max=0.0)
        out["kept_log_mass"] = mass
        out["min_p_log_prob"] = min_p_target(zd.gather(-1, targets.unsqueeze(-1)).squeeze(-1), thr, lz, mass)
    return TokenStats(**out)


def min_p_target(target_z: Tensor, thr: Tensor, logz: Tensor, kept_log_mass: Tensor) -> Tensor:
    """``log p_target − log M`` where ``target_z ≥ thr`` (the target survives the filter), else ``−inf``."""
    return torch.where(target_z >= thr, target_z - logz - kept_log_mass, torch.full_like(logz, -math.inf))


class RowStats:
    """The running statistics of one chunk of rows while the fused forward visits its column tiles."""

    def __init__(self, request: StatsRequest):
        self.request = request
        self.top_v: Tensor | None = None  # [n, <=K] largest tempered logits so far
        self.top_i: Tensor | None = None
        self.zmax: Tensor | None = None

    @property
    def wants_probs(self) -> bool:
        return self.request.sum_p2

    def logits(self, z: Tensor, c0: int) -> None:
        """Fold one tile's tempered logits (before they are overwritten): top-K and the row maximum."""
        k = self.request.top_k
        if k:
            v, i = torch.topk(z, min(k, z.shape[1]), dim=1)
            i = i + c0
            if self.top_v is not None:
                v, i = torch.cat([self.top_v, v], 1), torch.cat([self.top_i, i], 1)
                v, j = torch.topk(v, min(k, v.shape[1]), dim=1)
                i = i.gather(1, j)
            self.top_v, self.top_i = v, i
        elif self.request.min_p_log is not None:
            m = z.amax(dim=1)
            self.zmax = m if self.zmax is None else torch.maximum(self.zmax, m)

    @staticmethod
    def probs(p: Tensor) -> Tensor:
        """``q_t = Σ_{v∈tile} p̃_v²`` of the tile-local probabilities (one reduction, no temporary tile)."""
        return torch.linalg.vector_norm(p, 2, dim=1).square()

    def row_max(self) -> Tensor:
        return self.top_v[:, 0] if self.top_v is not None else self.zmax


def kept_log_mass(tiles, thr: Tensor, logz: Tensor) -> Tensor:
    """``log Σ_{z_v ≥ thr} p_v`` of a chunk of rows from a second sweep over its tiles (``tiles``
    yields each tempered-logit tile, which may be overwritten)."""
    acc = torch.full_like(thr, -math.inf)
    for z in tiles:
        acc = torch.logaddexp(acc, torch.logsumexp(z.masked_fill_(z < thr.unsqueeze(1), -math.inf), dim=1))
    return (acc - logz).clamp(max=0.0)


def add_top_k(grad_z: Tensor, top_ids: Tensor, c0: int, g_top: Tensor) -> None:
    """``grad_z[r, top_ids[r, k] − c0] += g_top[r, k]`` for the ids inside this tile (the one-hot
    part of ``∂ log p_j / ∂z = e_j − p``; the ``−p`` part goes into the row shift)."""
    local = top_ids - c0
    inside = (local >= 0) & (local < grad_z.shape[1])
    grad_z.scatter_add_(1, local.clamp(0, grad_z.shape[1] - 1), torch.where(inside, g_top, torch.zeros_like(g_top)))
