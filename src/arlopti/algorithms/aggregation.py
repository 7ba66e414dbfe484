"""How a per-token loss matrix ``[B, T]`` becomes one scalar (verl's ``loss_agg_mode``).

With ``m`` the response mask, ``L`` the per-token loss, ``S`` the number of sequences with at
least one valid token and ``T`` the padded response length:

* ``token-mean``              Σ_{b,t} L·m / Σ_{b,t} m
* ``seq-mean-token-mean``     Σ_b [Σ_t L·m / Σ_t m] / S
* ``seq-mean-token-sum``      Σ_b [Σ_t L·m] / S
* ``seq-mean-token-sum-norm`` Σ_{b,t} L·m / (S · T)          (Dr. GRPO's constant normaliser)

**Empty rows** (a response with no valid token: ``algorithm.dapo.mask_truncated`` masks a truncated
one whole; a Lopti phase with ``normalize=phase`` can leave a row empty): ``empty_rows="skip"`` (the
default) divides the seq-mean modes by S, the rows with a valid token (verl's ``agg_loss`` when it
gets no ``global_batch_size``: its legacy FSDP actor, the default worker up to v0.7);
``empty_rows="zero"`` by B, every row, an empty one counting as a zero row mean (TRL's GRPO/SAPO
normaliser ``(...).mean()`` over the batch; verl's engine workers, the only ones since v0.8, pass
``global_batch_size`` = the mini-batch's rows and do the same). With an empty row the two differ by
the factor B/S, in loss and gradient. ``token-mean`` has no rows: both are the same there.

``scale`` overrides the denominator (Σ m for ``token-mean``; S otherwise). The learner uses it
to normalise every micro-batch by the count of the whole mini-batch, summed over ranks, so the
gradient does not depend on how tokens fall into micro-batches or onto ranks. ``horizon``
overrides T for ``seq-mean-token-sum-norm`` (set it to the maximum response length so that the
constant does not change with each micro-batch's padding).
"""

from __future__ import annotations

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


#: How the seq-mean modes count a row with no valid token (module docstring).
EMPTY_ROWS = ("skip", "zero")


def aggregate(loss: Tensor, mask: Tensor, agg: str = "token-mean", scale: float | None = None,
              horizon: int | None = None, empty_rows: str = "skip") -> Tensor:
    """Reduce ``loss [B, T]`` with ``mask [B, T]`` according to ``agg`` (module docstring); without
    ``scale`` the denominator is :func:`normaliser`'s."""
    fn = LOSS_AGGREGATIONS.get(agg)
    if scale is None and empty_rows != "skip":
        scale = normaliser(mask, agg, empty_rows)
    return fn(loss, mask.to(loss.dtype), scale=scale, horizon=horizon)


def normaliser(mask: Tensor, agg: str, empty_rows: str = "skip") -> float:
    """The denominator of ``agg`` over ``mask [B, T]``: its valid tokens (``token-mean``), else its rows
    with a valid token, S (``empty_rows="skip"``), or all its rows, B (``"zero"``)."""
    LOSS_AGGREGATIONS.get(agg)  # validates the name
    if empty_rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows={empty_rows!r}: use one of {', '.join(EMPTY_ROWS)}")
    if agg == "token-mean":
        return float(mask.sum())
    if empty_rows == "zero":
        return float(mask.shape[0])
    return float((mask.sum(-1) > 0).sum())
