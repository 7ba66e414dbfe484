"""Pure weight-sync helpers: name mapping, tied heads, mismatch errors, bucketing, FSDP2 gathering."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arlopti.rollout.weight_sync import (WeightSyncError, buckets, check_names, checkpoint_name, full_tensor,
                                         named_sync_params, nbytes, stream_tensors)


@pytest.mark.parametrize("raw,name", [
    ("hf.model.embed_tokens.weight", "model.embed_tokens.weight"),
    ("_orig_mod.hf.model.norm.weight", "model.norm.weight"),
    ("module.hf._orig_mod.lm_head.weight", "lm_head.weight"),
    ("hf.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    ("_fsdp_wrapped_module.model.layers.3._fsdp_wrapped_module.self_attn.q_proj.bias",
     "model.layers.3.self_attn.q_proj.bias"),
    ("model.layers.0.mlp.module_x.weight", "model.layers.0.mlp.module_x.weight"),  # only whole segments
    ("model.hf.weight", "model.hf.weight"),  # "hf" is stripped only in front
])
def test_checkpoint_name_strips_wrappers(raw, name):
    assert checkpoint_name(raw) == name


def test_checkpoint_name_rejects_an_empty_result():
    with pytest.raises(WeightSyncError, match="empty"):
        checkpoint_name("module.hf")


class _Tiny(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(7, 3)
        self.lm_head = nn.Linear(3, 7, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight


def test_tied_head_is_dropped_untied_head_is_kept():
    tied = [n for n, _ in named_sync_params(_Tiny(True).named_parameters(), tie_word_embeddings=True)]
    assert tied == ["embed_tokens.weight"]
    # named_parameters() without de-duplication lists the shared tensor twice: the head still goes
    dup = [n for n, _ in named_sync_params(_Tiny(True).named_parameters(remove_duplicate=False), True)]
    assert dup == ["embed_tokens.weight"]
    untied = [n for n, _ in named_sync_params(_Tiny(False).named_parameters(), tie_word_embeddings=False)]
    assert untied == ["embed_tokens.weight", "lm_head.weight"]


def test_two_parameters_with_one_checkpoint_name_is_an_error():
    params = [("hf.a.weight", torch.zeros(1)), ("_orig_mod.a.weight", torch.zeros(1))]
    with pytest.raises(WeightSyncError, match="both map to checkpoint name 'a.weight'"):
        named_sync_params(params, tie_word_embeddings=False)


def test_check_names_lists_unknown_and_missing():
    check_names(["a", "b"], ["b", "a"])  # same set: fine
    with pytest.raises(WeightSyncError) as err:
        check_names(["a", "bogus.weight"], ["a", "c.weight"], where="the test engine")
    msg = str(err.value)
    assert "1 name(s) sent that the test engine does not hold: bogus.weight" in msg
    assert "1 name(s) the test engine holds that were not sent (would stay stale): c.weight" in msg


def test_check_names_truncates_long_lists():
    with pytest.raises(WeightSyncError, match=r"x19, \.\.\. \(5 more\)"):
        check_names([f"x{i:02d}" for i in range(25)], [])


def test_buckets_respect_the_byte_budget_and_order():
    items = [(f"p{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 10, 100, 5, 5])]
    got = [[name for name, _ in b] for b in buckets(items, bucket_bytes=80)]
    # 40 + 40 bytes fit, the third would make 120; the 400-byte tensor is a bucket alone
    assert got == [["p0", "p1"], ["p2"], ["p3"], ["p4", "p5"]]
    assert [n for b in got for n in b] == [n for n, _ in items]
    for b in buckets(items, bucket_bytes=80):
        assert len(b) == 1 or sum(nbytes(t) for _, t in b) <= 80
    assert [len(b) for b in buckets(items, bucket_bytes=0)] == [1] * 6


class FakeDTensor:
    """Stands in for an FSDP2 DTensor: reports the global size and gathers on ``full_tensor()``."""

    def __init__(self, full: torch.Tensor, log: list):
        self._full, self._log = full, log

    def numel(self) -> int:
        return self._full.numel()

    def element_size(self) -> int:
        return self._full.element_size()

    def full_tensor(self) -> torch.Tensor:
        self._log.append(("gather", id(self)))
        return self._full.clone()


def test_full_tensor_gathers_dtensors_and_detaches_plain_tensors():
    log: list = []
    t = torch.arange(6.0).view(2, 3)
    assert torch.equal(full_tensor(FakeDTensor(t, log)), t) and len(log) == 1
    p = nn.Parameter(torch.ones(2))
    out = full_tensor(p)
    assert not out.requires_grad and out.data_ptr() == p.data_ptr()


def test_stream_gathers_one_bucket_at_a_time_and_casts():
    log: list = []
    fulls = [torch.full((8,), float(i)) for i in range(5)]  # 32 bytes each in fp32
    items = [(f"w{i}", FakeDTensor(f, log)) for i, f in enumerate(fulls)]
    seen = []
    for name, t in stream_tensors(items, bucket_bytes=64, dtype=torch.bfloat16):
        # gathers so far: whole buckets of two, never further ahead than the current bucket
        seen.append(name)
        k = len(seen)
        assert len(log) == min(5, 2 * ((k + 1) // 2)), (k, len(log))
        assert t.dtype == torch.bfloat16
        assert torch.equal(t.float(), fulls[int(name[1:])])
    assert seen == [n for n, _ in items]
    assert len(log) == 5  # each parameter gathered exactly once


def test_stream_of_plain_parameters_keeps_dtype_when_none_given():
    m = nn.Linear(4, 2)
    out = list(stream_tensors(list(m.named_parameters()), bucket_bytes=1 << 20))
    assert [n for n, _ in out] == ["weight", "bias"]
    assert all(t.dtype == torch.float32 and not t.requires_grad for _, t in out)
