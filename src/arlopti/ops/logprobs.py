"""The one function every per-token log-prob in the project goes through.

``token_logprobs(hidden, weight, targets, temperature)`` returns, for each row ``n``,

    z[n]       = (hidden[n] @ weight.T + bias) / T
    logp[n]    = log softmax(z[n])[targets[n]]
    entropy[n] = -sum_v p[n, v] log p[n, v],   p[n] = softmax(z[n])

Old, reference and training log-probs all come from here, so the temperature is applied the
same way everywhere (the official code divides the logits by the rollout temperature in every
forward). With ``stats=StatsRequest(...)`` the same pass also returns statistics of each row's
full distribution (``Σ p²``, the top-K log-probs, a min-p filter's kept mass:
:mod:`arlopti.ops.tile_stats`), still without materialising the logits.

Two implementations, equal to within fp32 rounding:

* ``impl="naive"`` materialises the ``[N, V]`` logits in fp32 and lets autograd keep several
  ``[N, V]`` tensors alive for the backward (≈ 10 GB per copy at N = 16,384, V = 151,936).
* ``impl="fused"`` (:class:`FusedTokenLogprobs`) never holds more than one
  ``[token_chunk, vocab_chunk]`` fp32 tile (plus one scratch tile of the same size). The
  forward folds each tile into an online log-sum-exp that also carries the entropy
  (:class:`_OnlineStats`) and saves only the inputs and the per-row ``logZ`` / entropy; the backward
  recomputes every tile and accumulates ``grad_hidden``, ``grad_weight`` and ``grad_bias``
  with one GEMM each per tile. Cost: one extra logits GEMM (4 GEMMs instead of 3), traded for
  memory that no longer grows with ``N × V``.

Precision of the fused path: statistics, outputs and gradient accumulators are fp32. For fp32
inputs every GEMM is fp32. For bf16/fp16 inputs the logits GEMM runs in the input dtype (its
tile is rounded to that dtype once, exactly as the naive path rounds ``hidden @ weight.T``) and
is then widened to fp32; the two gradient GEMMs widen their operands to fp32, so per-tile
products are never rounded to bf16 before they are summed (rounding them biases training, see
TRL's ``_addmm_fp32``). Gradients are returned in the input dtypes. fp64 inputs are computed
and returned in fp64 throughout (for ``gradcheck``); naive always returns fp32.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from arlopti.ops.tile_stats import (RowStats, StatsRequest, TokenStats, add_top_k, kept_log_mass, min_p_target,
                                    stats_from_logits)

# Defaults from `benchmarks/bench_logprob.py --cases small --impls fused --sweep` (fp32, 2-core
# Xeon, heavily shared): 512x8192 .. 4096x8192 tiles were within ~25% of each other, larger ones
# slightly faster (fewer per-tile passes and grad_weight read-modify-writes). 2048 x 8192 keeps
# the scratch pair at 128 MiB, so the big case (V=151,936, H=896) stays under 1 GB in all.
DEFAULT_TOKEN_CHUNK = 2048
DEFAULT_VOCAB_CHUNK = 8192

IMPLS = ("naive", "fused")


def logprobs_from_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                         with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """Naive reference: fp32 log-softmax over the full vocabulary. ``logits`` is ``[..., V]``."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


# ----------------------------------------------------------------------------------- tiles


def _gemm_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """Operand dtype of the logits GEMM: autocast's dtype if autocast is on, else the promoted one."""
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _acc_dtype(gemm_dtype: torch.dtype) -> torch.dtype:
    """Dtype of tiles, statistics, outputs and accumulators: fp64 for fp64 inputs, else fp32."""
    return torch.float64 if gemm_dtype == torch.float64 else torch.float32


def _logits_tile(h: Tensor, w: Tensor, b_over_t: Tensor | None, inv_t: float, out: Tensor) -> Tensor:
    """``out[n, w] = (h @ w.T) * inv_t + b_over_t`` in ``out``'s (accumulation) dtype.

    ``h`` and ``w`` are already in the GEMM dtype. Low-precision operands: the product is rounded
    to their dtype once (as ``hidden @ weight.T`` in the naive path is), then widened into
    ``out``. Forward and backward both call this, so the recomputed tile is bit-identical to the
    one the forward folded.
    """
    if h.dtype == out.dtype:
        if b_over_t is None:
            # beta=0: ``out``'s uninitialised contents are ignored (NaNs included)
            return torch.addmm(out, h, w.t(), beta=0.0, alpha=inv_t, out=out)
        return torch.addmm(b_over_t, h, w.t(), alpha=inv_t, out=out)
    prod = torch.mm(h, w.t())
    if b_over_t is None:
        return torch.mul(prod, inv_t, out=out)
    return torch.add(b_over_t, prod, alpha=inv_t, out=out)


def _tile_buffers(n: int, v: int, token_chunk: int, vocab_chunk: int, dtype: torch.dtype,
                  device: torch.device, count: int) -> list[Tensor]:
    """``count`` flat scratch buffers, each big enough for one full tile."""
    size = min(n, token_chunk) * min(v, vocab_chunk)
    return [torch.empty(size, dtype=dtype, device=device) for _ in range(count)]


def _view(buf: Tensor, rows: int, cols: int) -> Tensor:
    """A contiguous ``[rows, cols]`` view at the start of a flat scratch buffer."""
    return buf[: rows * cols].view(rows, cols)


def _bias_over_t(bias: Tensor | None, inv_t: float, dtype: torch.dtype) -> Tensor | None:
    return None if bias is None else bias.to(dtype) * inv_t


def _fused_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                   inv_t: float, token_chunk: int, vocab_chunk: int, with_entropy: bool,
                   gemm_dtype: torch.dtype, stats: StatsRequest | None = None
                   ) -> tuple[Tensor, Tensor, Tensor | None, TokenStats | None]:
    """Tiled forward → ``(logp [N], logZ [N], entropy [N] | None, stats | None)`` in the accumulation dtype.

    Per tile: ``L = log_softmax(z)`` over the tile's columns, its log-normaliser
    ``lse_t = z[:, 0] − L[:, 0]`` and the entropy of the softmax restricted to the tile,
    ``h_t = −Σ e^L·L``. The tiles of a row are then folded into an online log-sum-exp
    (:class:`_OnlineStats`), so only ``[N]``-sized state outlives a tile; so are the requested
    statistics (:mod:`arlopti.ops.tile_stats`).
    """
    n_rows, v = hidden.shape[0], weight.shape[0]
    dev, acc = hidden.device, _acc_dtype(gemm_dtype)
    logz = torch.empty(n_rows, dtype=acc, device=dev)
    ent = torch.empty(n_rows, dtype=acc, device=dev) if with_entropy else None
    target_z = torch.zeros(n_rows, dtype=acc, device=dev)
    b_over_t = _bias_over_t(bias, inv_t, acc)
    bufs = _tile_buffers(n_rows, v, token_chunk, vocab_chunk, acc, dev, 2)
    parts: list[TokenStats] = []
    for r0 in range(0, n_rows, token_chunk):
        r1 = min(r0 + token_chunk, n_rows)
        h = hidden[r0:r1].to(gemm_dtype)
        tgt, tz = targets[r0:r1], target_z[r0:r1]
        online, rows = _OnlineStats(), (RowStats(stats) if stats else None)
        for c0 in range(0, v, vocab_chunk):
            c1 = min(c0 + vocab_chunk, v)
            z = _logits_tile(h, weight[c0:c1].to(gemm_dtype), None if b_over_t is None else b_over_t[c0:c1],
                             inv_t, _view(bufs[0], r1 - r0, c1 - c0))
            _take_target(z, tgt, c0, tz)
            if rows is not None:
                rows.logits(z, c0)
            online.add(*_tile_terms(z, _view(bufs[1], r1 - r0, c1 - c0), ent is not None, rows))
        logz[r0:r1] = online.logz()
        if ent is not None:
            ent[r0:r1] = online.entropy()
        if rows is not None:
            tiles = _row_tiles(h, weight, b_over_t, inv_t, vocab_chunk, gemm_dtype, bufs[0])
            parts.append(_finish_rows(rows, online, logz[r0:r1], tz, tiles))
    out = None
    if stats:
        out = _cat_stats(parts) if parts else _empty_stats(stats, dev, acc)
    return target_z - logz, logz, ent, out


def _row_tiles(h: Tensor, weight: Tensor, b_over_t: Tensor | None, inv_t: float, vocab_chunk: int,
               gemm_dtype: torch.dtype, buf: Tensor):
    """The tempered-logit tiles of rows ``h`` again, one at a time in ``buf`` (the min-p sweep)."""
    v = weight.shape[0]
    for c0 in range(0, v, vocab_chunk):
        c1 = min(c0 + vocab_chunk, v)
        yield _logits_tile(h, weight[c0:c1].to(gemm_dtype), None if b_over_t is None else b_over_t[c0:c1], inv_t,
                           _view(buf, h.shape[0], c1 - c0))


def _cat_stats(parts: list[TokenStats]) -> TokenStats:
    return TokenStats(*(None if col[0] is None else torch.cat(col) for col in zip(*parts)))


def _tile_terms(z: Tensor, buf: Tensor, want_entropy: bool, rows: RowStats | None):
    """One tile's ``(lse_t, h_t | None, q_t | None)`` for :meth:`_OnlineStats.add`; ``z`` is consumed."""
    # One fused row-wise kernel instead of amax / sub / exp / sum: on a busy 2-core host every
    # parallel region costs a scheduler slice, so the number of passes per tile matters.
    # (``torch.log_softmax`` has no ``out=``; a fresh [rows, cols] result each tile would
    # page-fault it in every time.)
    log_p = torch._log_softmax(z, 1, False, out=buf)
    lse_tile = z[:, 0] - log_p[:, 0]
    h_tile = q_tile = None
    if want_entropy or (rows is not None and rows.wants_probs):
        p = torch.exp(log_p, out=z)  # z is no longer needed
        if rows is not None and rows.wants_probs:
            q_tile = rows.probs(p)
        if want_entropy:
            h_tile = -p.mul_(log_p).sum(dim=1)
    return lse_tile, h_tile, q_tile


def _finish_rows(rows: RowStats, online: "_OnlineStats", logz: Tensor, target_z: Tensor, tiles) -> TokenStats:
    """A chunk of rows' statistics once all its tiles are folded (the min-p mass sweeps ``tiles`` again)."""
    req, out = rows.request, {}
    if req.sum_p2:
        out["sum_p2"] = online.sum_p2()
    if req.top_k:
        out["top_log_probs"], out["top_ids"] = rows.top_v - logz.unsqueeze(1), rows.top_i
    if req.min_p_log is not None:
        thr = rows.row_max() + req.min_p_log
        out["kept_log_mass"] = mass = kept_log_mass(tiles, thr, logz)
        out["min_p_log_prob"] = min_p_target(target_z, thr, logz, mass)
    return TokenStats(**out)


def _empty_stats(req: StatsRequest, dev: torch.device, dtype: torch.dtype) -> TokenStats:
    """The statistics of zero rows (shapes ``[0]`` / ``[0, K]``)."""
    z, minp = torch.zeros(0, dtype=dtype, device=dev), req.min_p_log is not None
    top = torch.zeros(0, req.top_k, dtype=dtype, device=dev) if req.top_k else None
    ids = torch.zeros(0, req.top_k, dtype=torch.long, device=dev) if req.top_k else None
    return TokenStats(z if req.sum_p2 else None, top, ids, z if minp else None, z if minp else None)


class _OnlineStats:
    """Online merge of per-tile ``(lse_t, h_t)`` into a row's ``logZ`` and entropy.

    State, relative to the running max ``m`` of the tiles' ``lse_t``, with ``w_t = exp(lse_t − m)``:
    ``s = Σ w_t`` (the running sum of the online log-sum-exp), ``b = Σ w_t·h_t`` and
    ``c = Σ w_t·(m − lse_t)``; a new max rescales all three by ``exp(m_old − m_new)`` (and shifts
    ``c`` by ``(m_new − m_old)·s``). Then ``logZ = m + log s`` and, because the softmax over the
    row is the mixture of the tiles' softmaxes with weights ``π_t = w_t / s``,
    ``H = Σ π_t h_t + Σ π_t (logZ − lse_t) = (b + c)/s + log s`` — a sum of non-negative terms.
    (Forming ``logZ − Σ p·z`` instead loses ~1e-5 of the entropy to cancellation, and carrying
    ``logZ`` itself as the running value adds an absolute rounding of ``|logZ|·eps`` per tile.)
    With ``q_t = Σ_{v∈t} p̃_v²`` (tile-local probabilities) also ``d = Σ w_t²·q_t``, rescaled by the
    square, and ``Σ_v p_v² = Σ_t (w_t/s)²·q_t = d / s²``.
    """

    def __init__(self) -> None:
        self.m: Tensor | None = None

    def add(self, lse_t: Tensor, h_t: Tensor | None, q_t: Tensor | None = None) -> None:
        """Fold one tile's ``lse_t [n]`` (and ``h_t [n]`` when the entropy is wanted, ``q_t [n]``
        when ``Σ p²`` is) into the state."""
        if self.m is None:
            self.m, self.s = lse_t, torch.ones_like(lse_t)
            self.b = h_t
            self.c = None if h_t is None else torch.zeros_like(lse_t)
            self.d = q_t
            return
        m_new = torch.maximum(self.m, lse_t)
        rescale, w = torch.exp(self.m - m_new), torch.exp(lse_t - m_new)
        if h_t is not None:
            self.c = rescale * (self.c + (m_new - self.m) * self.s) + w * (m_new - lse_t)
            self.b = rescale * self.b + w * h_t
        if q_t is not None:
            self.d = rescale.square() * self.d + w.square() * q_t
        self.s = rescale * self.s + w
        self.m = m_new

    def sum_p2(self) -> Tensor:
        return self.d / self.s.square()

    def logz(self) -> Tensor:
        return self.m + self.s.log()

    def entropy(self) -> Tensor:
        return (self.b + self.c) / self.s + self.s.log()


def _take_target(z: Tensor, tgt: Tensor, c0: int, out: Tensor) -> None:
    """Write ``z[r, tgt[r] − c0]`` into ``out[r]`` for the rows whose target is in this tile."""
    local = tgt - c0
    inside = (local >= 0) & (local < z.shape[1])
    picked = z.gather(1, local.clamp(0, z.shape[1] - 1).unsqueeze(1)).squeeze(1)
    out.copy_(torch.where(inside, picked, out))


def _fused_backward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                    logz: Tensor, entropy: Tensor | None, grad_logp: Tensor | None,
                    grad_ent: Tensor | None, inv_t: float, token_chunk: int, vocab_chunk: int,
                    gemm_dtype: torch.dtype, needs: tuple[bool, bool, bool],
                    top: tuple[Tensor, Tensor] | None = None
                    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Recompute the tiles; return ``(grad_hidden, grad_weight, grad_bias)`` in the accumulation dtype.

    A gradient nobody needs is ``None`` and its GEMM is skipped. With ``L = log p`` of the tile,
    ``g`` the incoming grad of ``logp`` and ``k`` that of the entropy, the gradient w.r.t. the
    tempered logits is ``G = g·(onehot − p) − k·p·(L + H) = (−k·L − g − k·H)·p + g·onehot``
    (``dH/dz_v = −p_v (z_v − Σ_u p_u z_u) = −p_v (L_v + H)``); the chain through ``z = y/T``
    puts ``inv_t`` on every GEMM. ``top = (grad, ids)`` of the top-K log-probs adds
    ``Σ_k g_k·(onehot_k − p)``: ``Σ_k g_k`` joins ``g`` in the row shift and each ``g_k`` its one-hot.
    """
    need_h, need_w, need_b = needs
    n_rows, v = hidden.shape[0], weight.shape[0]
    dev, acc = hidden.device, _acc_dtype(gemm_dtype)
    grad_h = torch.zeros(hidden.shape, dtype=acc, device=dev) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=dev) if need_w else None
    grad_b = torch.zeros(v, dtype=acc, device=dev) if need_b else None
    if (grad_logp is None and grad_ent is None and top is None) or not any(needs):
        return grad_h, grad_w, grad_b
    b_over_t = _bias_over_t(bias, inv_t, acc)
    bufs = _tile_buffers(n_rows, v, token_chunk, vocab_chunk, acc, dev, 1 if grad_ent is None else 2)
    for r0 in range(0, n_rows, token_chunk):
        r1 = min(r0 + token_chunk, n_rows)
        h = hidden[r0:r1].to(gemm_dtype)
        h_acc = hidden[r0:r1].to(acc)  # gradient GEMMs never round their products to bf16
        g = None if grad_logp is None else grad_logp[r0:r1].to(acc)
        k = None if grad_ent is None else grad_ent[r0:r1].to(acc)
        g_top = None if top is None else top[0][r0:r1].to(acc)
        row_scale, row_shift = _row_coefficients(g, k, None if entropy is None else entropy[r0:r1],
                                                 None if g_top is None else g_top.sum(1))
        tgt, lz = targets[r0:r1], logz[r0:r1]
        for c0 in range(0, v, vocab_chunk):
            c1 = min(c0 + vocab_chunk, v)
            rows, cols = r1 - r0, c1 - c0
            w = weight[c0:c1]
            tile = _logits_tile(h, w.to(gemm_dtype), None if b_over_t is None else b_over_t[c0:c1], inv_t,
                                _view(bufs[0], rows, cols))
            logp_tile = tile.sub_(lz.unsqueeze(1))
            if row_scale is None:  # no entropy gradient: G = −g·p (+ one-hot)
                grad_z = logp_tile.exp_().mul_(row_shift.unsqueeze(1))
            else:
                p = torch.exp(logp_tile, out=_view(bufs[1], rows, cols))
                grad_z = torch.addcmul(row_shift.unsqueeze(1), logp_tile, row_scale.unsqueeze(1),
                                       out=logp_tile).mul_(p)
            if g is not None:
                _add_target(grad_z, tgt, c0, g)
            if g_top is not None:
                add_top_k(grad_z, top[1][r0:r1], c0, g_top)
            if grad_h is not None:
                grad_h[r0:r1].addmm_(grad_z, w.to(acc), alpha=inv_t)
            if grad_w is not None:
                grad_w[c0:c1].addmm_(grad_z.t(), h_acc, alpha=inv_t)
            if grad_b is not None:
                grad_b[c0:c1].add_(grad_z.sum(dim=0), alpha=inv_t)
    return grad_h, grad_w, grad_b


def _row_coefficients(g: Tensor | None, k: Tensor | None, entropy: Tensor | None,
                      g_top_sum: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
    """Per-row ``(scale, shift)`` with ``G = (scale·L + shift)·p`` before the one-hot terms.

    ``scale = −k`` and ``shift = −(g + k·H)``; without an entropy gradient ``scale`` is ``None``
    and ``G = shift·p`` with ``shift = −g``. ``g_top_sum`` (the top-K grads' row sum) adds to ``g``.
    """
    if g_top_sum is not None:
        g = g_top_sum if g is None else g + g_top_sum
    if k is None:
        return None, -g
    shift = -k * entropy if g is None else -(g + k * entropy)
    return -k, shift


def _add_target(grad_z: Tensor, tgt: Tensor, c0: int, g: Tensor) -> None:
    """``grad_z[r, tgt[r] − c0] += g[r]`` for the rows whose target falls in this tile (no host sync)."""
    local = tgt - c0
    inside = (local >= 0) & (local < grad_z.shape[1])
    grad_z.scatter_add_(1, local.clamp(0, grad_z.shape[1] - 1).unsqueeze(1),
                        torch.where(inside, g, torch.zeros_like(g)).unsqueeze(1))


class FusedTokenLogprobs(torch.autograd.Function):
    """``apply(hidden [N,H], weight [V,H], bias [V]|None, targets [N], temperature, token_chunk,
    vocab_chunk, with_entropy[, stats]) → (logp [N], entropy [N] | None)`` without ``[N, V]`` logits;
    with a :class:`~arlopti.ops.tile_stats.StatsRequest` ``stats``, the five
    :class:`~arlopti.ops.tile_stats.TokenStats` fields follow (None where not requested; only the
    top-K log-probs carry a gradient).

    Outputs are fp32 (fp64 for fp64 inputs). Targets must lie in ``[0, V)`` (unchecked here).

    Saved for backward: the inputs (no copies), ``logZ [N]``, ``entropy [N]`` and the top-K ids. Peak
    extra memory: two fp32 ``[token_chunk, vocab_chunk]`` tiles, plus the fp32 gradient accumulators
    in the backward (``[N,H]`` and ``[V,H]``; for fp32 inputs these are the returned grads).
    Entropy (or top-K log-probs) that no loss uses costs no backward work (``set_materialize_grads(False)``).
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                temperature: float, token_chunk: int, vocab_chunk: int, with_entropy: bool,
                stats: StatsRequest | None = None):
        ctx.set_materialize_grads(False)
        gemm_dtype = _gemm_dtype(hidden, weight)
        inv_t = 1.0 / temperature
        with torch.autocast(hidden.device.type, enabled=False):
            logp, logz, entropy, extra = _fused_forward(hidden, weight, bias, targets, inv_t, token_chunk,
                                                        vocab_chunk, with_entropy, gemm_dtype, stats)
        top_ids = None if extra is None else extra.top_ids
        ctx.save_for_backward(hidden, weight, bias, targets, logz, entropy, top_ids)
        ctx.cfg = (inv_t, token_chunk, vocab_chunk, gemm_dtype)
        if extra is None:
            return logp, entropy
        ctx.mark_non_differentiable(*(t for name, t in zip(TokenStats._fields, extra)
                                      if t is not None and name != "top_log_probs"))
        return (logp, entropy, *extra)

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_ent: Tensor | None, *grad_stats):
        hidden, weight, bias, targets, logz, entropy, top_ids = ctx.saved_tensors
        inv_t, token_chunk, vocab_chunk, gemm_dtype = ctx.cfg
        needs = tuple(ctx.needs_input_grad[:3])
        grad_top = grad_stats[TokenStats._fields.index("top_log_probs")] if grad_stats else None
        with torch.autocast(hidden.device.type, enabled=False):
            gh, gw, gb = _fused_backward(hidden, weight, bias, targets, logz, entropy, grad_logp, grad_ent,
                                         inv_t, token_chunk, vocab_chunk, gemm_dtype, needs,
                                         None if grad_top is None else (grad_top, top_ids))
        return (None if gh is None else gh.to(hidden.dtype),
                None if gw is None else gw.to(weight.dtype),
                None if gb is None else gb.to(bias.dtype),
                None, None, None, None, None, None)


def fused_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0,
                         bias: Tensor | None = None, with_entropy: bool = True,
                         token_chunk: int = DEFAULT_TOKEN_CHUNK, vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
                         stats: StatsRequest | None = None):
    """:class:`FusedTokenLogprobs` on 2-D ``hidden [N, H]`` / 1-D ``targets [N]`` (no checks; see
    :func:`token_logprobs` for the checked entry point): ``(logp, entropy)``, and with ``stats`` a
    third element, the :class:`~arlopti.ops.tile_stats.TokenStats`."""
    out = FusedTokenLogprobs.apply(hidden, weight, bias, targets, float(temperature), int(token_chunk),
                                   int(vocab_chunk), bool(with_entropy), stats or None)
    return out if len(out) == 2 else (out[0], out[1], TokenStats(*out[2:]))


# ------------------------------------------------------------------------------ entry point


def _check_inputs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                  bias: Tensor | None, valid: Tensor | None, token_chunk: int, vocab_chunk: int) -> None:
    """Shape/dtype/range checks; each error names the argument and how to fix it."""
    if weight.dim() != 2:
        raise ValueError(f"token_logprobs: weight must be [V, H], got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"token_logprobs: hidden {tuple(hidden.shape)} must end in H={weight.shape[1]} "
                         f"(the LM head weight is {tuple(weight.shape)})")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"token_logprobs: targets {tuple(targets.shape)} must have hidden's leading "
                         f"shape {tuple(hidden.shape[:-1])}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"token_logprobs: targets must be integer token ids, got {targets.dtype}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"token_logprobs: bias {tuple(bias.shape)} must be [V]=[{weight.shape[0]}]")
    if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"token_logprobs: temperature must be a positive finite number, got {temperature!r}")
    if valid is not None and (valid.dtype != torch.bool or valid.shape != targets.shape):
        raise ValueError(f"token_logprobs: valid must be a bool tensor shaped like targets "
                         f"{tuple(targets.shape)}, got {valid.dtype} {tuple(valid.shape)}")
    for name, value in (("token_chunk", token_chunk), ("vocab_chunk", vocab_chunk)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"token_logprobs: {name} must be a positive int, got {value!r}")


def _check_target_range(targets: Tensor, vocab: int) -> None:
    # The fused tiles clamp indices, so an out-of-range id would silently score a wrong token.
    if not targets.numel():
        return
    lo, hi = torch.stack(torch.aminmax(targets)).tolist()  # one device sync
    if lo < 0 or hi >= vocab:
        raise ValueError(f"token_logprobs: targets must lie in [0, {vocab}) (got min {lo}, max {hi}); "
                         "pass valid=targets.ne(ignore_index) to skip padding/ignored positions")


def token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0,
                   bias: Tensor | None = None, impl: str = "naive",
                   with_entropy: bool = True, *, valid: Tensor | None = None,
                   token_chunk: int = DEFAULT_TOKEN_CHUNK,
                   vocab_chunk: int = DEFAULT_VOCAB_CHUNK, stats: StatsRequest | None = None):
    """Per-token log-probs (and entropy) of ``targets`` under the LM head ``weight``.

    Shapes: ``hidden [..., H]``, ``weight [V, H]``, ``targets [...]``, ``bias [V]`` → ``[...]``
    each, fp32 (fused keeps fp64 inputs in fp64). ``impl``: ``"naive"`` (full logits) or
    ``"fused"`` (tiled, see :class:`FusedTokenLogprobs`); both give the same values and gradients
    up to rounding.

    ``valid`` (optional bool, shaped like ``targets``): rows where it is False are not computed
    at all — their ``logp`` and ``entropy`` are 0, they get exactly zero gradient and their
    ``targets`` are never read (so ``-100`` padding is fine there). Selecting the valid rows
    needs their count, and the target range check (always done) needs their min/max: one
    device sync each per call.
    ``token_chunk`` / ``vocab_chunk``: tile size of the fused path (ignored by naive).

    Returns ``(logp, entropy | None)``; with ``stats`` (a :class:`~arlopti.ops.tile_stats.StatsRequest`)
    ``(logp, entropy | None, TokenStats)``, each statistic shaped ``[...]`` (top-K: ``[..., K]``) and
    0 on rows that are not ``valid``.
    """
    if impl not in IMPLS:
        raise ValueError(f"model.logprob_impl={impl!r} is unknown; use 'fused' or 'naive'")
    _check_inputs(hidden, weight, targets, temperature, bias, valid, token_chunk, vocab_chunk)
    if stats is not None and stats.top_k > weight.shape[0]:
        raise ValueError(f"token_logprobs: stats.top_k={stats.top_k} exceeds the vocabulary ({weight.shape[0]})")
    lead = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1)
    keep = None
    if valid is not None:
        keep = valid.reshape(-1).nonzero().squeeze(1)
        flat_h, flat_t = flat_h.index_select(0, keep), flat_t.index_select(0, keep)
    _check_target_range(flat_t, weight.shape[0])
    extra = None
    if impl == "naive":
        logits = flat_h @ weight.t()
        if bias is not None:
            logits = logits + bias
        logp, entropy = logprobs_from_logits(logits, flat_t, temperature, with_entropy)
        if stats is not None:
            extra = stats_from_logits(logits.float() / temperature, stats, flat_t) if stats else TokenStats()
    else:
        logp, entropy, *rest = fused_token_logprobs(flat_h, weight, flat_t, temperature, bias, with_entropy,
                                                    token_chunk, vocab_chunk, stats)
        extra = rest[0] if rest else (None if stats is None else TokenStats())
    if keep is not None:
        logp, entropy = _scatter_rows(logp, keep, valid.numel()), _scatter_rows(entropy, keep, valid.numel())
        extra = None if extra is None else extra.map(lambda t: _scatter_rows(t, keep, valid.numel()))
    out = logp.view(lead), (None if entropy is None else entropy.view(lead))
    if stats is None:
        return out
    return (*out, extra.map(lambda t: t.view(*lead, *t.shape[1:])))


def _scatter_rows(t: Tensor | None, keep: Tensor, n: int) -> Tensor | None:
    """Rows ``keep`` of an ``[n, ...]`` result of zeros filled from ``t`` (the valid rows')."""
    return None if t is None else t.new_zeros(n, *t.shape[1:]).index_copy(0, keep, t)
