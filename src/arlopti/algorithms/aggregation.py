"""How a per-token loss matrix ``[B, T]`` becomes one scalar (verl's ``loss_agg_mode``).

With ``m`` the response mask, ``L`` the per-token loss, ``S`` the number of sequences with at
least one valid token and ``T`` the padded response length:

* ``token-mean``              Σ_{b,t} L·m / Σ_{b,t} m
* ``seq-mean-token-mean``     Σ_b [Σ_t L·m / Σ_t m] / S
* ``seq-mean-token-sum``      Σ_b [Σ_t L·m] / S
* ``seq-mean-token-sum-norm`` Σ_{b,t} L·m / (S · T)          (Dr. GRPO's constant normaliser)

A response with no valid token (e.g. a truncated one masked whole) does not count in S (verl's legacy
FSDP actor). A method that counts it as a zero row mean passes its own ``scale``
(:func:`arlopti.plugins.rival_losses.row_count`).

``scale`` overrides the denominator (Σ m for ``token-mean``; S otherwise). The learner uses it
to normalise every micro-batch by the count of the whole mini-batch, summed over ranks, so the
gradient does not depend on how tokens fall into micro-batches or onto ranks. ``horizon``
overrides T for ``seq-mean-token-sum-norm`` (set it to the maximum response length so that the
constant does not change with each micro-batch's padding).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from arlopti.config.registries import LOSS_AGGREGATIONS


def _seq_count(mask: Tensor) -> Tensor:
    return (mask.sum(-1) > 0).sum().to(mask.dtype)


@LOSS_AGGREGATIONS.register("token-mean")
def _token_mean(loss: Tensor, mask: Tensor, scale: float | None = None, horizon: int | None = None) -> Tensor:
    denom = mask.sum().clamp(min=1) if scale is None else scale
    return (loss * mask).sum() / denom


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss: Tensor, mask: Tensor, scale: float | None = None,
                         horizon: int | None = None) -> Tensor:
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    denom = _seq_count(mask).clamp(min=1) if scale is None else scale
    return per_seq.sum() / denom


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss: Tensor, mask: Tensor, scale: float | None = None,
                        horizon: int | None = None) -> Tensor:
    denom = _seq_count(mask).clamp(min=1) if scale is None else scale
    return (loss * mask).sum() / denom


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, scale: float | None = None,
                             horizon: int | None = None) -> Tensor:
    denom = _seq_count(mask).clamp(min=1) if scale is None else scale
    return (loss * mask).sum() / (denom * (mask.shape[-1] if horizon is None else horizon))


@dataclass(frozen=True)
class LossScale:
    """The learner's denominators (module docstring): ``value`` overrides the count (``scale``), ``horizon``
    the length T of ``seq-mean-token-sum-norm``; None keeps the micro-batch's own."""

    value: float | None = None
    horizon: int | None = None


@dataclass(frozen=True)
class Aggregation:
    """One reduction of per-token values: mode ``algorithm.loss_agg``, over ``mask`` (None: the caller's
    response mask), with the denominators of :class:`LossScale`."""

    mode: str
    mask: Tensor | None = None
    scale: LossScale = LossScale()

    def __call__(self, values: Tensor, mask: Tensor | None = None) -> Tensor:
        """:func:`aggregate` of ``values`` over :attr:`mask` (or ``mask`` where that is None)."""
        return aggregate(values, mask if self.mask is None else self.mask, self.mode, scale=self.scale.value,
                         horizon=self.scale.horizon)


def aggregate(loss: Tensor, mask: Tensor, agg: str = "token-mean", scale: float | None = None,
              horizon: int | None = None) -> Tensor:
    """Reduce ``loss [B, T]`` with ``mask [B, T]`` according to ``agg`` (module docstring)."""
    return LOSS_AGGREGATIONS.get(agg)(loss, mask.to(loss.dtype), scale=scale, horizon=horizon)


def normaliser(mask: Tensor, agg: str) -> float:
    """The denominator of ``agg`` over ``mask [B, T]``: its valid tokens (``token-mean``), else its rows
    with a valid token, S."""
    LOSS_AGGREGATIONS.get(agg)  # validates the name
    if agg == "token-mean":
        return float(mask.sum())
    return float((mask.sum(-1) > 0).sum())
