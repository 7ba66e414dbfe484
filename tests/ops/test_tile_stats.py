"""Full-distribution statistics of the fused pass (``token_logprobs(..., stats=...)``): against a
hand-computed distribution, against full logits in fp64, with gradients through the top-K log-probs,
on many tiles, with ``valid`` rows and with zero rows; and that asking for none changes nothing."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.ops.logprobs import token_logprobs
from arlopti.ops.tile_stats import StatsRequest, TokenStats

from torch.utils._python_dispatch import TorchDispatchMode

FP32 = {"rtol": 1e-5, "atol_frac": 1e-5}  # as tests/ops/test_logprobs.py


def assert_close(actual, expected, rtol, atol_frac, what):
    a, e = actual.detach().double(), expected.detach().double()
    atol = atol_frac * float(e.abs().max()) if e.numel() else 0.0
    assert float(((a - e).abs() - (atol + rtol * e.abs())).max()) <= 0, f"{what}: {float((a - e).abs().max()):.3e}"


def make_inputs(n, h, v, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g) * (2.0 / h ** 0.5)
    b = torch.randn(v, generator=g) if bias else None
    return [hidden, weight, b], torch.randint(0, v, (n,), generator=g), None, None


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

ALL = StatsRequest(sum_p2=True, top_k=3, min_p_log=math.log(0.1))


def _hand_case():
    """One row, V = 4, logits log([0.5, 0.3, 0.15, 0.05]) (so p is exactly that), identity head."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    return torch.log(p).unsqueeze(0), torch.eye(4, dtype=torch.float64), p


@pytest.mark.parametrize("impl,vc", [("naive", 4), ("fused", 4), ("fused", 1), ("fused", 3)])
def test_statistics_of_a_hand_computed_distribution(impl, vc):
    hidden, weight, p = _hand_case()
    lp, _, st = token_logprobs(hidden, weight, torch.tensor([2]), impl=impl, vocab_chunk=vc, stats=ALL)
    assert lp.item() == pytest.approx(math.log(0.15))
    assert st.sum_p2.item() == pytest.approx(0.25 + 0.09 + 0.0225 + 0.0025)  # 0.365
    assert st.top_ids.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(st.top_log_probs.double(), torch.log(p[:3]).unsqueeze(0))  # naive: fp32
    # min-p 0.1: keep p >= 0.1 * 0.5 = 0.05 -> all four (0.05 is on the threshold: kept)
    assert st.kept_log_mass.item() == pytest.approx(0.0, abs=1e-12)
    assert st.min_p_log_prob.item() == pytest.approx(math.log(0.15))
    for target, expected in ((1, math.log(0.3 / 0.8)), (2, -math.inf)):  # min-p 0.5 keeps 0.5 and 0.3 (>= 0.25)
        _, _, st2 = token_logprobs(hidden, weight, torch.tensor([target]), impl=impl, vocab_chunk=vc,
                                   stats=StatsRequest(min_p_log=math.log(0.5)))
        assert st2.kept_log_mass.item() == pytest.approx(math.log(0.8))
        assert st2.min_p_log_prob.item() == pytest.approx(expected)
        assert st2.sum_p2 is None and st2.top_log_probs is None


def test_temperature_acts_on_every_statistic():
    hidden, weight, p = _hand_case()
    _, _, st = token_logprobs(hidden, weight, torch.tensor([0]), temperature=0.5, impl="fused", vocab_chunk=3,
                              stats=ALL)
    q = p ** 2 / (p ** 2).sum()  # softmax(log p / 0.5)
    assert st.sum_p2.item() == pytest.approx(float((q ** 2).sum()))
    torch.testing.assert_close(st.top_log_probs[0], torch.log(q[:3]))
    assert st.kept_log_mass.item() == pytest.approx(float(torch.log(q[q >= 0.1 * q[0]].sum())))


def _fp64_reference(leaves, targets, temperature, k, delta, g_top):
    hidden, weight, bias = (None if x is None else x.detach().double().requires_grad_() for x in leaves)
    z = (hidden @ weight.t() + (0 if bias is None else bias)) / temperature
    logp_all = torch.log_softmax(z, -1)
    ids = torch.topk(z.detach(), k, -1).indices
    top = logp_all.gather(1, ids)
    keep = z.detach() >= z.detach().amax(-1, keepdim=True) + delta
    kept = torch.log((logp_all.exp() * keep).sum(-1))
    lp_t = logp_all.gather(1, targets.unsqueeze(1)).squeeze(1)
    proxy = torch.where(keep.gather(1, targets.unsqueeze(1)).squeeze(1), lp_t - kept, torch.tensor(-math.inf))
    (top * g_top.double()).sum().backward()
    stats = TokenStats((logp_all.exp() ** 2).sum(-1).detach(), top.detach(), ids, kept.detach(), proxy.detach())
    return stats, [None if x is None else x.grad for x in (hidden, weight, bias)]


@pytest.mark.parametrize("impl,tc,vc", [("naive", 8, 8), ("fused", 8, 10), ("fused", 1, 1), ("fused", 64, 4096)])
def test_statistics_and_top_k_gradient_match_fp64(impl, tc, vc):
    leaves, targets, _, _ = make_inputs(37, 16, 101, seed=31)
    g_top = torch.randn(37, 3, generator=torch.Generator().manual_seed(4))
    ref, ref_grads = _fp64_reference(leaves, targets, 0.7, 3, math.log(0.1), g_top)
    x = [None if t is None else t.detach().clone().requires_grad_() for t in leaves]
    _, _, st = token_logprobs(x[0], x[1], targets, 0.7, x[2], impl=impl, token_chunk=tc, vocab_chunk=vc, stats=ALL)
    assert torch.equal(st.top_ids, ref.top_ids)
    for name in ("sum_p2", "top_log_probs", "kept_log_mass"):
        assert_close(getattr(st, name), getattr(ref, name), **FP32, what=name)
    finite = torch.isfinite(ref.min_p_log_prob)
    assert 0 < int(finite.sum()) < 37 and torch.equal(torch.isfinite(st.min_p_log_prob), finite)
    assert_close(st.min_p_log_prob[finite], ref.min_p_log_prob[finite], **FP32, what="min_p_log_prob")
    (st.top_log_probs * g_top).sum().backward()
    for name, a, b in zip(("hidden", "weight", "bias"), (t.grad for t in x), ref_grads):
        assert_close(a, b, **FP32, what=f"grad_{name} through the top-K log-probs")


def test_top_k_gradient_adds_to_the_target_and_entropy_gradient():
    leaves, targets, _, _ = make_inputs(30, 12, 77, seed=32)
    cg, ce = torch.randn(30, generator=torch.Generator().manual_seed(6)), torch.rand(30)
    g_top = torch.randn(30, 2, generator=torch.Generator().manual_seed(5))
    grads = {}
    for impl in ("naive", "fused"):
        x = [t.detach().clone().requires_grad_() for t in leaves]
        lp, en, st = token_logprobs(x[0], x[1], targets, 0.9, x[2], impl=impl, token_chunk=7, vocab_chunk=20,
                                    stats=StatsRequest(top_k=2))
        ((lp * cg).sum() + (en * ce).sum() + (st.top_log_probs * g_top).sum()).backward()
        grads[impl] = [t.grad for t in x]
    for name, a, b in zip(("hidden", "weight", "bias"), grads["fused"], grads["naive"]):
        assert_close(a, b, **FP32, what=f"grad_{name}")


def test_asking_for_nothing_changes_nothing():
    leaves, targets, cg, ce = make_inputs(25, 8, 60, seed=33)
    plain = token_logprobs(leaves[0], leaves[1], targets, 0.7, leaves[2], impl="fused", token_chunk=6, vocab_chunk=7)
    empty = token_logprobs(leaves[0], leaves[1], targets, 0.7, leaves[2], impl="fused", token_chunk=6, vocab_chunk=7,
                           stats=StatsRequest())
    assert len(plain) == 2 and len(empty) == 3 and empty[2] == TokenStats()
    assert torch.equal(plain[0], empty[0]) and torch.equal(plain[1], empty[1])
    with_stats = token_logprobs(leaves[0], leaves[1], targets, 0.7, leaves[2], impl="fused", token_chunk=6,
                                vocab_chunk=7, stats=ALL)
    assert torch.equal(plain[0], with_stats[0]) and torch.equal(plain[1], with_stats[1])  # bit for bit


def test_valid_rows_zero_rows_and_leading_dims():
    leaves, targets, _, _ = make_inputs(24, 8, 50, seed=34)
    valid = torch.arange(24) % 4 != 0
    _, _, st = token_logprobs(leaves[0].view(4, 6, 8), leaves[1], targets.view(4, 6), bias=leaves[2], impl="fused",
                              valid=valid.view(4, 6), token_chunk=5, vocab_chunk=9, stats=ALL)
    _, _, full = token_logprobs(leaves[0], leaves[1], targets, bias=leaves[2], impl="naive", stats=ALL)
    assert st.top_log_probs.shape == (4, 6, 3) and st.sum_p2.shape == (4, 6)
    assert torch.all(st.sum_p2.view(-1)[~valid] == 0)
    assert_close(st.sum_p2.view(-1)[valid], full.sum_p2[valid], **FP32, what="valid sum_p2")
    assert torch.equal(st.top_ids.view(24, 3)[valid], full.top_ids[valid])
    _, _, none = token_logprobs(leaves[0], leaves[1], targets, bias=leaves[2], impl="fused", stats=ALL,
                                valid=torch.zeros(24, dtype=torch.bool))
    assert torch.all(none.top_log_probs == 0) and none.top_ids.shape == (24, 3)


def test_extremes_of_p_near_zero_and_one():
    # one row with p_0 = 1 - 3e-9 (logits 0, -20, -20, -20), one uniform row
    hidden = torch.tensor([[0.0, -20.0, -20.0, -20.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    _, _, st = token_logprobs(hidden, torch.eye(4, dtype=torch.float64), torch.tensor([1, 1]), impl="fused",
                              vocab_chunk=2, stats=ALL)
    p0 = 1 / (1 + 3 * math.exp(-20))
    assert st.sum_p2[0].item() == pytest.approx(p0 ** 2 + 3 * (p0 * math.exp(-20)) ** 2, rel=1e-12)
    assert st.kept_log_mass[0].item() == pytest.approx(math.log(p0), rel=1e-9)  # the three 2e-9 tokens dropped
    assert st.min_p_log_prob[0].item() == -math.inf  # target 1 (p = 2e-9) is noise to the filter
    assert st.sum_p2[1].item() == pytest.approx(0.25) and st.kept_log_mass[1].item() == 0.0
    assert 1 - 2 * p0 + st.sum_p2[0].item() == pytest.approx(0.0, abs=1e-8)  # OTB's weight vanishes at p -> 1


def test_bad_requests_are_rejected():
    leaves, targets, _, _ = make_inputs(4, 4, 9, seed=35)
    with pytest.raises(ValueError, match="top_k=10 exceeds the vocabulary"):
        token_logprobs(leaves[0], leaves[1], targets, stats=StatsRequest(top_k=10))
    with pytest.raises(ValueError, match="min_p_log must be <= 0"):
        StatsRequest(min_p_log=0.5)
    with pytest.raises(ValueError, match="top_k must be an int"):
        StatsRequest(top_k=-1)


def test_statistics_never_materialise_n_by_v():
    n, h, v, tc, vc = 64, 8, 512, 16, 64
    leaves, targets, _, _ = make_inputs(n, h, v, seed=36, bias=False)
    hidden, weight = (x.clone().requires_grad_() for x in leaves[:2])
    with _MaxNumel() as probe:
        lp, en, st = token_logprobs(hidden, weight, targets, impl="fused", token_chunk=tc, vocab_chunk=vc, stats=ALL)
        (lp.sum() + en.sum() + st.top_log_probs.sum()).backward()
    assert probe.max_numel <= max(v * h, n * h, tc * vc)
