"""benchmarks/probe_shared_prefix.py: each group's prompt forwarded once gives the one-pass forward's
log-probs and gradients on the tiny model (issue 50's exactness bar), and the probe's grouping is right."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "probe_shared_prefix.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_shared_prefix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_of_one_prompt_share_it_whatever_their_padding(probe):
    ids, mask = probe.grouped_batch(vocab=50, prompt_len=8, resp_len=5, group=3, prompts=2)
    first, inv = probe.prompt_groups(ids, mask, 8)
    assert len(first) == 2 and inv.tolist()[:3] == [inv[0]] * 3 and inv[3] != inv[0]
    assert torch.equal(ids[first[inv], :8], ids[:, :8])


def test_the_shared_prefix_forward_gives_the_one_pass_log_probs_and_gradients(probe, tiny_model):
    torch.manual_seed(0)
    tiny_model.train()
    got = probe.compare(tiny_model, prompt_len=20, resp_len=12, group=4, prompts=2, rounds=1)
    assert got["max_dlogp"] <= 1e-5
    assert got["grad_cos"] >= 0.99999 and got["grad_max_rel"] <= 1e-4
