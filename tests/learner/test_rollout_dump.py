"""Rollout dump files: the array codec, and read_dump's errors. The callback that writes them
during training is tested in tests/callbacks/test_rollout_dump.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arlopti.learner.rollout_dump import decode_array, encode_array, read_dump


def test_array_codec_round_trip():
    x = torch.tensor([0.125, 0.5, 0.999])
    assert np.allclose(decode_array(encode_array(x, "<f2"), "<f2"), x.numpy(), atol=1e-3)
    ids = [5, 0, 511]
    assert decode_array(encode_array(ids, "<i4"), "<i4").tolist() == ids


def test_bad_inputs_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "other"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: schema"):
        read_dump(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no rollouts_step"):
        read_dump(empty)
