"""The one function every per-token log-prob in the project goes through.

``token_logprobs(hidden, weight, targets, temperature)`` returns, for each row ``n``,

    z[n]       = (hidden[n] @ weight.T + bias) / T
    logp[n]    = log softmax(z[n])[targets[n]]
    entropy[n] = -sum_v p[n, v] log p[n, v],   p[n] = softmax(z[n])

Old, reference and training log-probs all come from here, so the temperature is applied the
same way everywhere (the official code divides the logits by the rollout temperature in every
forward).

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
                   gemm_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor | None]:
    """Tiled forward → ``(logp [N], logZ [N], entropy [N] | None)`` in the accumulation dtype.

    Per tile: ``L = log_softmax(z)`` over the tile's columns, its log-normaliser
    ``lse_t = z[:, 0] − L[:, 0]`` and the entropy of the softmax restricted to the tile,
    ``h_t = −Σ e^L·L``. The tiles of a row are then folded into an online log-sum-exp
    (:class:`_OnlineStats`), so only ``[N]``-sized state outlives a tile.
    """
    n_rows, v = hidden.shape[0], weight.shape[0]
    dev, acc = hidden.device, _acc_dtype(gemm_dtype)
    logz = torch.empty(n_rows, dtype=acc, device=dev)
    ent = torch.empty(n_rows, dtype=acc, device=dev) if with_entropy else None
    target_z = torch.zeros(n_rows, dtype=acc, device=dev)
    b_over_t = _bias_over_t(bias, inv_t, acc)
    bufs = _tile_buffers(n_rows, v, token_chunk, vocab_chunk, acc, dev, 2)
    for r0 in range(0, n_rows, token_chunk):
        r1 = min(r0 + token_chunk, n_rows)
        h = hidden[r0:r1].to(gemm_dtype)
        tgt, tz = targets[r0:r1], target_z[r0:r1]
        stats = _OnlineStats()
        for c0 in range(0, v, vocab_chunk):
            c1 = min(c0 + vocab_chunk, v)
            rows, cols = r1 - r0, c1 - c0
            z = _logits_tile(h, weight[c0:c1].to(gemm_dtype), None if b_over_t is None else b_over_t[c0:c1],
                             inv_t, _view(bufs[0], rows, cols))
            _take_target(z, tgt, c0, tz)
            # One fused row-wise kernel instead of amax / sub / exp / sum: on a busy 2-core host every
            # parallel region costs a scheduler slice, so the number of passes per tile matters.
            # (``torch.log_softmax`` has no ``out=``; a fresh [rows, cols] result each tile would
            # page-fault it in every time.)
            log_p = torch._log_softmax(z, 1, False, out=_view(bufs[1], rows, cols))
            lse_tile = z[:, 0] - log_p[:, 0]
            h_tile = None
            if ent is not None:
                p = torch.exp(log_p, out=z)  # z is no longer needed
                h_tile = -p.mul_(log_p).sum(dim=1)
            stats.add(lse_tile, h_tile)
        logz[r0:r1] = stats.logz()
        if ent is not None:
            ent[r0:r1] = stats.entropy()
    return target_z - logz, logz, ent


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
    """

    def __init__(self) -> None:
        self.m: Tensor | None = None

    def add(self, lse_t: Tensor, h_t: Tensor | None) -> None:
        """Fold one tile's ``lse_t [n]`` (and ``h_t [n]`` when the entropy is wanted) into the state."""
        if self.m is None:
            self.m, self.s = lse_t, torch.ones_like(lse_t)
            self.b = h_t
            self.c = None if h_t is None else torch.zeros_like(lse_t)
            return
        m_new = torch.maximum(self.m, lse_t)
        rescale, w = torch.exp(self.m - m_new), torch.exp(lse_t - m_new)
        if h_t is not None:
            self.c = rescale * (self.c + (m_new - self.m) * self.s) + w * (m_new - lse_t)
            self.b = rescale * self.b + w * h_t
        self.s = rescale * self.s + w
        self.m = m_new

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
                    gemm_dtype: torch.dtype, needs: tuple[bool, bool, bool]
                    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Recompute the tiles; return ``(grad_hidden, grad_weight, grad_bias)`` in the accumulation dtype.

    A gradient nobody needs is ``None`` and its GEMM is skipped. With ``L = log p`` of the tile,
    ``g`` the incoming grad of ``logp`` and ``k`` that of the entropy, the gradient w.r.t. the
    tempered logits is ``G = g·(onehot − p) − k·p·(L + H) = (−k·L − g − k·H)·p + g·onehot``
    (``dH/dz_v = −p_v (z_v − Σ_u p_u z_u) = −p_v (L_v + H)``); the chain through ``z = y/T``
    puts ``inv_t`` on every GEMM.
    """
    need_h, need_w, need_b = needs
    n_rows, v = hidden.shape[0], weight.shape[0]
    dev, acc = hidden.device, _acc_dtype(gemm_dtype)
    grad_h = torch.zeros(hidden.shape, dtype=acc, device=dev) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=dev) if need_w else None
    grad_b = torch.zeros(v, dtype=acc, device=dev) if need_b else None
    if (grad_logp is None and grad_ent is None) or not any(needs):
        return grad_h, grad_w, grad_b
    b_over_t = _bias_over_t(bias, inv_t, acc)
    bufs = _tile_buffers(n_rows, v, token_chunk, vocab_chunk, acc, dev, 1 if grad_ent is None else 2)
    for r0 in range(0, n_rows, token_chunk):
        r1 = min(r0 + token_chunk, n_rows)
        h = hidden[r0:r1].to(gemm_dtype)
        h_acc = hidden[r0:r1].to(acc)  # gradient GEMMs never round their products to bf16
        g = None if grad_logp is None else grad_logp[r0:r1].to(acc)
        k = None if grad_ent is None else grad_ent[r0:r1].to(acc)
        row_scale, row_shift = _row_coefficients(g, k, None if entropy is None else entropy[r0:r1])
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
            if grad_h is not None:
                grad_h[r0:r1].addmm_(grad_z, w.to(acc), alpha=inv_t)
            if grad_w is not None:
                grad_w[c0:c1].addmm_(grad_z.t(), h_acc, alpha=inv_t)
            if grad_b is not None:
                grad_b[c0:c1].add_(grad_z.sum(dim=0), alpha=inv_t)
    return grad_h, grad_w, grad_b


def _row_coefficients(g: Tensor | None, k: Tensor | None, entropy: Tensor | None
                      ) -> tuple[Tensor | None, Tensor]:
    """Per-row ``(scale, shift)`` with ``G = (scale·L + shift)·p`` before the one-hot term.

    ``scale = −k`` and ``shift = −(g + k·H)``; without an entropy gradient ``scale`` is ``None``
    and ``G = shift·p`` with ``shift = −g``.
    """
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
    vocab_chunk, with_entropy) → (logp [N], entropy [N] | None)`` without ``[N, V]`` logits.

    Outputs are fp32 (fp64 for fp64 inputs). Targets must lie in ``[0, V)`` (unchecked here).

    Saved for backward: the inputs (no copies), ``logZ [N]`` and ``entropy [N]``. Peak extra
    memory: two fp32 ``[token_chunk, vocab_chunk]`` tiles, plus the fp32 gradient accumulators
    in the backward (``[N,H]`` and ``[V,H]``; for fp32 inputs these are the returned grads).
    Entropy that no loss uses costs no backward work (``set_materialize_grads(False)``).
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                temperature: float, token_chunk: int, vocab_chunk: int, with_entropy: bool):
        ctx.set_materialize_grads(False)
        gemm_dtype = _gemm_dtype(hidden, weight)
        inv_t = 1.0 / temperature
        with torch.autocast(hidden.device.type, enabled=False):
            logp, logz, entropy = _fused_forward(hidden, weight, bias, targets, inv_t, token_chunk,
                                                 vocab_chunk, with_entropy, gemm_dtype)
        ctx.save_for_backward(hidden, weight, bias, targets, logz, entropy)
        ctx.cfg = (inv_t, token_chunk, vocab_chunk, gemm_dtype)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_ent: Tensor | None):
        hidden, weight, bias, targets, logz, entropy = ctx.saved_tensors
        inv_t, token_chunk, vocab_chunk, gemm_dtype = ctx.cfg
        needs = tuple(ctx.needs_input_grad[:3])
        with torch.autocast(hidden.device.type, enabled=False):
            gh, gw, gb = _fused_backward(hidden, weight, bias, targets, logz, entropy, grad_logp, grad_ent,
                                         inv_t, token_chunk, vocab_chunk, gemm_dtype, needs)
        return (None if gh is None else gh.to(hidden.dtype),
                None if gw is None else gw.to(weight.dtype),
                None if gb is None else gb.to(bias.dtype),
                None, None, None, None, None)


def fused_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0,
                         bias: Tensor | None = None, with_entropy: bool = True,
                         token_chunk: int = DEFAULT_TOKEN_CHUNK,
                         vocab_chunk: int = DEFAULT_VOCAB_CHUNK) -> tuple[Tensor, Tensor | None]:
    """:class:`FusedTokenLogprobs` on 2-D ``hidden [N, H]`` / 1-D ``targets [N]`` (no checks; see
    :func:`token_logprobs` for the checked entry point)."""
    return FusedTokenLogprobs.apply(hidden, weight, bias, targets, float(temperature), int(token_chunk),
                                    int(vocab_chunk), bool(with_entropy))


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
                   vocab_chunk: int = DEFAULT_VOCAB_CHUNK) -> tuple[Tensor, Tensor | None]:
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
    """
    if impl not in IMPLS:
        raise ValueError(f"model.logprob_impl={impl!r} is unknown; use 'fused' or 'naive'")
    _check_inputs(hidden, weight, targets, temperature, bias, valid, token_chunk, vocab_chunk)
    lead = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1)
    keep = None
    if valid is not None:
        keep = valid.reshape(-1).nonzero().squeeze(1)
        flat_h, flat_t = flat_h.index_select(0, keep), flat_t.index_select(0, keep)
    _check_target_range(flat_t, weight.shape[0])
    if impl == "naive":
        logits = flat_h @ weight.t()
        if bias is not None:
            logits = logits + bias
        logp, entropy = logprobs_from_logits(logits, flat_t, temperature, with_entropy)
    else:
        logp, entropy = fused_token_logprobs(flat_h, weight, flat_t, temperature, bias, with_entropy,
                                             token_chunk, vocab_chunk)
    if keep is not None:
        n = valid.numel()
        logp = logp.new_zeros(n).index_copy(0, keep, logp)
        entropy = None if entropy is None else entropy.new_zeros(n).index_copy(0, keep, entropy)
    return logp.view(lead), (None if entropy is None else entropy.view(lead))
