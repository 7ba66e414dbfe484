"""``arlopti.rollout.hf.gumbel_argmax``: the arg-max of ``z + Gumbel noise`` with the noise hashed only
where it can matter must be the dense arg-max exactly (peaked, flat and filtered rows, ties, NaN),
and must hash far fewer entries than ``B × V`` on peaked rows."""

from __future__ import annotations

import pytest
import torch

from arlopti.rollout import hf
from arlopti.rollout.seeds import sample_seed

SEEDS = torch.tensor([hf._signed(sample_seed(3, i, 0), 64) for i in range(16)])


def _dense(z, keys, offsets):
    return (hf.gumbel_noise(keys, offsets) + z).argmax(-1)


def test_the_noise_span_bounds_every_noise_value():
    m = torch.tensor([0, 2**23 - 1], dtype=torch.int32)  # the extreme 23-bit mantissas of u
    lo, hi = m.to(torch.float32).add_(0.5).mul_(2.0**-23).log_().neg_().log_().neg_().tolist()
    assert hi - lo < hf._GUMBEL_SPAN - 0.5 and lo == pytest.approx(-2.8115, abs=1e-4)


@pytest.mark.parametrize("scale", [0.05, 1.0, 8.0, 60.0])
@pytest.mark.parametrize("shape", [(1, 7), (5, 491), (16, 3000)])
def test_it_is_the_dense_argmax(scale, shape):
    for trial in range(6):
        z = torch.randn(*shape, generator=torch.Generator().manual_seed(trial)) * scale
        if trial % 3 == 1:
            z[:, 1::3] = float("-inf")  # filtered entries (top-k / top-p)
        if trial % 3 == 2:
            z = z.round()  # many ties: the lowest index must win, as argmax picks
        keys, offsets = hf.row_step_keys(SEEDS[:shape[0]], trial), hf.vocab_offsets(shape[1], "cpu")
        assert torch.equal(hf.gumbel_argmax(z, keys, offsets), _dense(z, keys, offsets)), (scale, shape, trial)


def test_peaked_rows_hash_few_entries_and_odd_rows_fall_back(monkeypatch):
    hashed = []
    real = hf._gumbel_of
    monkeypatch.setattr(hf, "_gumbel_of", lambda x: hashed.append(x.numel()) or real(x))
    z = torch.randn(8, 20000, generator=torch.Generator().manual_seed(0)) * 12  # a peaked row's spread
    keys, offsets = hf.row_step_keys(SEEDS[:8], 0), hf.vocab_offsets(20000, "cpu")
    assert torch.equal(hf.gumbel_argmax(z, keys, offsets), _dense(z, keys, offsets))
    assert hashed[0] < 0.1 * z.numel()
    hashed.clear()
    z[3, 5] = float("nan")  # argmax's NaN semantics: the dense path
    assert torch.equal(hf.gumbel_argmax(z, keys, offsets), _dense(z, keys, offsets))
    assert hashed[0] == z.numel()
