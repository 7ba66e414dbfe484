"""``token_logprobs``: the fused tiled path equals the naive full-logits path (values and grads).

Reference = ``impl="naive"`` on the same inputs. fp32 tolerance: ``rtol=1e-5`` plus an ``atol``
of ``1e-5 × max|reference|``: elements near zero have no meaningful relative error, and naive's
own fp32 error against an fp64 computation reaches ~3e-6 of the tensor's scale on these shapes
(``test_fused_is_as_accurate_as_naive`` checks that fused is no less accurate). bf16:
``rtol=atol_frac=2e-2``. Shapes are chosen so that N and V are not multiples of the chunks and
tiny chunks force many tiles.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from arlopti.ops.logprobs import (DEFAULT_TOKEN_CHUNK, DEFAULT_VOCAB_CHUNK, FusedTokenLogprobs, fused_token_logprobs,
                                  logprobs_from_logits, token_logprobs)

FP32 = {"rtol": 1e-5, "atol_frac": 1e-5}
BF16 = {"rtol": 2e-2, "atol_frac": 2e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol_frac: float, what: str):
    assert actual.shape == expected.shape, what
    a, e = actual.double(), expected.double()
    atol = atol_frac * float(e.abs().max()) if e.numel() else 0.0
    err = (a - e).abs() - (atol + rtol * e.abs())
    assert float(err.max()) <= 0, (f"{what}: max |diff| {float((a - e).abs().max()):.3e} "
                                   f"exceeds atol {atol:.1e} + rtol {rtol}·|ref|")


def make_inputs(n, h, v, seed, dtype=torch.float32, bias=True, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g) * (scale / h ** 0.5)
    b = torch.randn(v, generator=g) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    cg, ce = torch.randn(n, generator=g), torch.randn(n, generator=g)
    leaves = [hidden.to(dtype), weight.to(dtype), None if b is None else b.to(dtype)]
    return leaves, targets, cg, ce


def run(impl, leaves, targets, cg, ce, temperature=1.0, with_entropy=True, use=("logp", "entropy"), **kw):
    """Values and grads of ``Σ cg·logp + Σ ce·entropy`` (only the terms in ``use``)."""
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in leaves]
    hidden, weight, bias = leaves
    logp, ent = token_logprobs(hidden, weight, targets, temperature, bias, impl=impl,
                               with_entropy=with_entropy, **kw)
    loss = torch.zeros(())
    if "logp" in use:
        loss = loss + (logp * cg).sum()
    if "entropy" in use:
        loss = loss + (ent * ce).sum()
    loss.backward()
    grads = [None if x is None else x.grad for x in leaves]
    return logp.detach(), (None if ent is None else ent.detach()), grads


def compare(ref, got, tol, label):
    (lp_r, en_r, g_r), (lp_g, en_g, g_g) = ref, got
    assert lp_g.dtype == torch.float32
    assert_close(lp_g, lp_r, **tol, what=f"{label} logp")
    if en_r is not None:
        assert_close(en_g, en_r, **tol, what=f"{label} entropy")
    for name, a, b in zip(("grad_hidden", "grad_weight", "grad_bias"), g_g, g_r):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype, name
            assert_close(a, b, **tol, what=f"{label} {name}")


SHAPES = [  # (N, H, V, token_chunk, vocab_chunk)
    (37, 16, 101, 8, 10),      # neither N nor V divisible by the chunks
    (64, 24, 257, 64, 256),    # one token chunk, V = chunk + 1
    (19, 8, 53, 1, 1),         # one-element tiles: every row and column its own tile
    (50, 32, 300, 1024, 8192), # chunks bigger than the problem (a single tile)
    (130, 16, 1000, 32, 96),
]


@pytest.mark.parametrize("n,h,v,tc,vc", SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_matches_naive_fp32(n, h, v, tc, vc, temperature):
    leaves, targets, cg, ce = make_inputs(n, h, v, seed=n + v)
    ref = run("naive", leaves, targets, cg, ce, temperature)
    got = run("fused", leaves, targets, cg, ce, temperature, token_chunk=tc, vocab_chunk=vc)
    compare(ref, got, FP32, f"N={n} V={v} tiles {tc}x{vc} T={temperature}")


def test_fused_matches_naive_without_bias_and_with_sharp_logits():
    leaves, targets, cg, ce = make_inputs(70, 16, 333, seed=3, bias=False, scale=8.0)
    ref = run("naive", leaves, targets, cg, ce, 0.6)
    got = run("fused", leaves, targets, cg, ce, 0.6, token_chunk=16, vocab_chunk=50)
    compare(ref, got, FP32, "no bias, logits std ~13")


@pytest.mark.parametrize("use", [("logp",), ("entropy",)])
def test_gradient_from_one_output_only(use):
    leaves, targets, cg, ce = make_inputs(33, 12, 211, seed=5)
    ref = run("naive", leaves, targets, cg, ce, 1.3, use=use)
    got = run("fused", leaves, targets, cg, ce, 1.3, use=use, token_chunk=7, vocab_chunk=30)
    compare(ref, got, FP32, f"grad from {use}")


def test_without_entropy():
    leaves, targets, cg, ce = make_inputs(41, 12, 150, seed=6)
    ref = run("naive", leaves, targets, cg, ce, 0.8, with_entropy=False, use=("logp",))
    got = run("fused", leaves, targets, cg, ce, 0.8, with_entropy=False, use=("logp",),
              token_chunk=9, vocab_chunk=40)
    assert ref[1] is None and got[1] is None
    compare(ref, got, FP32, "with_entropy=False")


def test_fused_matches_naive_bf16():
    leaves, targets, cg, ce = make_inputs(45, 32, 300, seed=7, dtype=torch.bfloat16)
    ref = run("naive", leaves, targets, cg, ce, 0.9)
    got = run("fused", leaves, targets, cg, ce, 0.9, token_chunk=16, vocab_chunk=64)
    compare(ref, got, BF16, "bf16")
    assert all(g.dtype == torch.bfloat16 for g in got[2])


def exact_fp64(leaves, targets, cg, ce, temperature=1.0):
    """Independent fp64 reference (plain log_softmax + autograd), same outputs as :func:`run`."""
    hidden, weight, bias = (None if x is None else x.detach().double().requires_grad_() for x in leaves)
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    logp_all = torch.log_softmax(z / temperature, dim=-1)
    logp = logp_all.gather(1, targets.unsqueeze(1)).squeeze(1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    ((logp * cg.double()).sum() + (ent * ce.double()).sum()).backward()
    return logp.detach(), ent.detach(), [None if x is None else x.grad for x in (hidden, weight, bias)]


def _errors(result, exact):
    """Max |result − exact| / max |exact| for logp, entropy and each gradient."""
    pairs = [(result[0], exact[0]), (result[1], exact[1]), *zip(result[2], exact[2])]
    return [float((a.double() - e).abs().max() / e.abs().max()) for a, e in pairs]


@pytest.mark.parametrize("n,h,v,tc,vc", [SHAPES[0], SHAPES[4]])
def test_fused_is_as_accurate_as_naive(n, h, v, tc, vc):
    """Against fp64 the fused error is naive-sized: the fused/naive gap is rounding, not a bug."""
    leaves, targets, cg, ce = make_inputs(n, h, v, seed=n + v)
    exact = exact_fp64(leaves, targets, cg, ce, 0.7)
    err_naive = _errors(run("naive", leaves, targets, cg, ce, 0.7), exact)
    err_fused = _errors(run("fused", leaves, targets, cg, ce, 0.7, token_chunk=tc, vocab_chunk=vc), exact)
    for name, ef, en in zip(("logp", "entropy", "grad_h", "grad_w", "grad_b"), err_fused, err_naive):
        assert ef <= 2 * en + 1e-6, f"{name}: fused error {ef:.2e} vs naive {en:.2e}"
        assert ef < 1e-5, name


def test_fused_bf16_error_is_bf16_rounding_only():
    """fp32 accumulators: from bf16 inputs, fused is no further from fp64 than naive is."""
    leaves, targets, cg, ce = make_inputs(40, 32, 500, seed=8, dtype=torch.bfloat16)
    exact = exact_fp64(leaves, targets, cg, ce)
    err_fused = _errors(run("fused", leaves, targets, cg, ce, token_chunk=16, vocab_chunk=96), exact)
    err_naive = _errors(run("naive", leaves, targets, cg, ce), exact)
    for name, ef, en in zip(("logp", "entropy", "grad_h", "grad_w", "grad_b"), err_fused, err_naive):
        assert ef <= 1.5 * en + 1e-6, f"{name}: fused error {ef:.2e} vs naive {en:.2e}"


def test_under_cpu_autocast_matches_naive():
    leaves, targets, cg, ce = make_inputs(30, 16, 120, seed=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = run("naive", leaves, targets, cg, ce)
        got = run("fused", leaves, targets, cg, ce, token_chunk=8, vocab_chunk=32)
    compare(ref, got, BF16, "autocast bf16")


def _tied_model_grads(impl, seed=11, temperature=0.8):
    """Embedding → tanh(· @ A) → tied head; returns the total grads of the embedding and A."""
    torch.manual_seed(seed)
    v, h, n = 97, 16, 40
    emb = torch.nn.Embedding(v, h)
    proj = torch.nn.Parameter(torch.randn(h, h) / h ** 0.5)
    ids = torch.randint(0, v, (n,))
    targets = torch.randint(0, v, (n,))
    hidden = torch.tanh(emb(ids) @ proj)
    logp, ent = token_logprobs(hidden, emb.weight, targets, temperature, impl=impl,
                               token_chunk=6, vocab_chunk=20)
    (logp.mul(torch.linspace(-1, 1, n)).sum() + ent.mul(torch.linspace(1, 2, n)).sum()).backward()
    return logp.detach(), emb.weight.grad, proj.grad


def test_tied_embedding_and_head_total_gradient():
    lp_n, g_emb_n, g_proj_n = _tied_model_grads("naive")
    lp_f, g_emb_f, g_proj_f = _tied_model_grads("fused")
    assert_close(lp_f, lp_n, **FP32, what="tied logp")
    assert_close(g_emb_f, g_emb_n, **FP32, what="tied embedding grad (head + input use)")
    assert_close(g_proj_f, g_proj_n, **FP32, what="tied projection grad")


def test_masked_loss_rows_get_zero_gradient():
    leaves, targets, cg, ce = make_inputs(48, 16, 180, seed=12)
    mask = (torch.arange(48) % 3 != 0).float()
    ref = run("naive", leaves, targets, cg * mask, ce * mask)
    got = run("fused", leaves, targets, cg * mask, ce * mask, token_chunk=10, vocab_chunk=25)
    compare(ref, got, FP32, "masked loss")
    grad_hidden = got[2][0]
    assert torch.all(grad_hidden[mask == 0] == 0)
    assert torch.all(grad_hidden[mask == 1].abs().sum(-1) > 0)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_valid_rows_skip_work_and_ignore_index_targets(impl):
    leaves, targets, cg, ce = make_inputs(30, 8, 64, seed=13)
    valid = torch.rand(30, generator=torch.Generator().manual_seed(1)) > 0.4
    padded = targets.masked_fill(~valid, -100)  # ignored rows may hold any id
    lp, en, grads = run(impl, leaves, padded, cg, ce, valid=valid, token_chunk=7, vocab_chunk=9)
    full = run("naive", leaves, targets, cg * valid, ce * valid)
    assert torch.all(lp[~valid] == 0) and torch.all(en[~valid] == 0)
    assert_close(lp[valid], full[0][valid], **FP32, what="valid logp")
    assert_close(en[valid], full[1][valid], **FP32, what="valid entropy")
    for name, a, b in zip(("hidden", "weight", "bias"), grads, full[2]):
        assert_close(a, b, **FP32, what=f"valid grad_{name}")
    assert torch.all(grads[0][~valid] == 0)


def test_valid_all_false_gives_zeros_and_a_usable_graph():
    leaves, targets, cg, ce = make_inputs(5, 8, 20, seed=14)
    lp, en, grads = run("fused", leaves, targets, cg, ce, valid=torch.zeros(5, dtype=torch.bool))
    assert torch.all(lp == 0) and torch.all(en == 0)
    assert all(torch.all(g == 0) for g in grads)


def test_leading_dims_are_kept():
    leaves, targets, cg, ce = make_inputs(24, 8, 50, seed=15)
    hidden, weight, bias = leaves
    lp, en = token_logprobs(hidden.view(4, 6, 8), weight, targets.view(4, 6), bias=bias, impl="fused")
    lp_ref, en_ref = token_logprobs(hidden, weight, targets, bias=bias, impl="naive")
    assert lp.shape == en.shape == (4, 6)
    assert_close(lp.reshape(-1), lp_ref, **FP32, what="[B,T] logp")
    assert_close(en.reshape(-1), en_ref, **FP32, what="[B,T] entropy")


def test_chunking_does_not_change_the_result():
    leaves, targets, cg, ce = make_inputs(60, 16, 400, seed=16)
    a = run("fused", leaves, targets, cg, ce, 0.9, token_chunk=60, vocab_chunk=400)
    b = run("fused", leaves, targets, cg, ce, 0.9, token_chunk=7, vocab_chunk=33)
    compare(a, b, FP32, "one tile vs many tiles")


def test_frozen_head_and_no_grad():
    leaves, targets, _, _ = make_inputs(20, 8, 40, seed=17)
    hidden = leaves[0].clone().requires_grad_()
    weight = leaves[1]  # frozen: no grad wanted, so its GEMM is skipped
    lp, en = token_logprobs(hidden, weight, targets, impl="fused", token_chunk=6, vocab_chunk=16)
    (lp.sum() + en.sum()).backward()
    ref_h = hidden.detach().clone().requires_grad_()
    lr, er = token_logprobs(ref_h, weight, targets, impl="naive")
    (lr.sum() + er.sum()).backward()
    assert weight.grad is None
    assert_close(hidden.grad, ref_h.grad, **FP32, what="frozen-head grad_hidden")
    with torch.no_grad():
        lp2, _ = token_logprobs(hidden, weight, targets, impl="fused")
    assert not lp2.requires_grad
    assert_close(lp2, lr.detach(), **FP32, what="no_grad logp")


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(18)
    hidden = torch.randn(3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.tensor([0, 4, 2])
    # 2 x 2 tiles: a partial row chunk and a partial vocab chunk
    fn = lambda h, w, b: fused_token_logprobs(h, w, targets, 1.3, b, True, 2, 2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))
    fn_lp = lambda h, w, b: fused_token_logprobs(h, w, targets, 0.5, b, False, 2, 3)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn_lp, (hidden, weight, bias))


class _MaxNumel(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_fused_never_materialises_n_by_v(impl):
    n, h, v, tc, vc = 64, 8, 512, 16, 64
    leaves, targets, cg, ce = make_inputs(n, h, v, seed=19, bias=False)
    hidden, weight = (x.clone().requires_grad_() for x in leaves[:2])
    with _MaxNumel() as probe:
        lp, en = token_logprobs(hidden, weight, targets, impl=impl, token_chunk=tc, vocab_chunk=vc)
        ((lp * cg).sum() + (en * ce).sum()).backward()
    largest_allowed = max(v * h, n * h, tc * vc)  # the weight (and its grad), hidden, one tile
    if impl == "fused":
        assert probe.max_numel <= largest_allowed
    else:  # the probe does see a full [N, V] tensor when one exists
        assert probe.max_numel >= n * v


def test_function_returns_none_entropy_when_not_requested():
    leaves, targets, _, _ = make_inputs(4, 4, 9, seed=20)
    lp, en = FusedTokenLogprobs.apply(leaves[0], leaves[1], None, targets, 1.0, 2, 4, False)
    assert en is None
    ref, _ = logprobs_from_logits(leaves[0] @ leaves[1].t(), targets, with_entropy=False)
    assert_close(lp, ref, **FP32, what="Function.apply logp")


def test_defaults_are_positive():
    assert DEFAULT_TOKEN_CHUNK >= 1 and DEFAULT_VOCAB_CHUNK >= 1


@pytest.mark.parametrize("kwargs,match", [
    ({"impl": "flash"}, "unknown"),
    ({"temperature": 0.0}, "temperature"),
    ({"token_chunk": 0}, "token_chunk"),
    ({"valid": torch.ones(6)}, "valid"),
])
def test_bad_arguments_are_rejected(kwargs, match):
    leaves, targets, _, _ = make_inputs(6, 4, 10, seed=21)
    with pytest.raises(ValueError, match=match):
        token_logprobs(leaves[0], leaves[1], targets, **kwargs)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_bad_shapes_and_targets_are_rejected(impl):
    leaves, targets, _, _ = make_inputs(6, 4, 10, seed=22)
    hidden, weight, _ = leaves
    with pytest.raises(ValueError, match="targets must lie in"):
        token_logprobs(hidden, weight, targets.masked_fill(targets == targets[0], -100), impl=impl)
    with pytest.raises(ValueError, match="targets must lie in"):
        token_logprobs(hidden, weight, torch.full((6,), 10), impl=impl)
    with pytest.raises(ValueError, match="must end in H"):
        token_logprobs(hidden[:, :3], weight, targets, impl=impl)
    with pytest.raises(ValueError, match="leading"):
        token_logprobs(hidden, weight, targets[:5], impl=impl)
    with pytest.raises(ValueError, match="bias"):
        token_logprobs(hidden, weight, targets, bias=torch.zeros(9), impl=impl)
