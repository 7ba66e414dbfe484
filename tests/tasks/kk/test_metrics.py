"""K&K torchmetrics: values, and sum reduction across ranks (merged states)."""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.tasks.kk.metrics import FormatRate, KKAccuracyPerN, KKMetrics, MeanReward

REWARDS = [3.0, -0.5, -1.0, -3.0, 3.0, 3.0]
PEOPLE = [3, 3, 4, 4, 5, 3]


def test_values():
    acc = KKAccuracyPerN()
    acc.update(REWARDS, PEOPLE)
    assert acc.compute() == {3: pytest.approx(2 / 3), 4: 0.0, 5: 1.0}
    fmt, mean = FormatRate(), MeanReward()
    fmt.update(REWARDS)
    mean.update(torch.tensor(REWARDS))
    assert fmt.compute().item() == pytest.approx(5 / 6)
    assert mean.compute().item() == pytest.approx(sum(REWARDS) / 6)
    m = KKMetrics()
    m.update(REWARDS, PEOPLE)
    out = m.compute()
    assert out["accuracy"] == pytest.approx(0.5) and out["format_rate"] == pytest.approx(5 / 6)
    assert out["ratio_3"] == 0.5
    assert out["ratio_-0.5"] == out["ratio_-1"] == out["ratio_-3"] == pytest.approx(1 / 6)
    assert out["accuracy_3ppl"] == pytest.approx(2 / 3) and out["accuracy_5ppl"] == 1.0
    assert "accuracy_6ppl" not in out


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_empty_metrics_are_nan_not_zero():
    assert math.isnan(FormatRate().compute().item())
    assert math.isnan(KKMetrics().compute()["accuracy"])
    assert KKAccuracyPerN().compute() == {}


def test_merging_rank_states_equals_one_pass():
    # What DDP's sum reduction does: add the states of every rank.
    for cls, args in ((KKAccuracyPerN, True), (KKMetrics, True), (FormatRate, False), (MeanReward, False)):
        whole, a, b = cls(), cls(), cls()
        call = (lambda m, r, n: m.update(r, n)) if args else (lambda m, r, n: m.update(r))
        call(whole, REWARDS, PEOPLE)
        call(a, REWARDS[:2], PEOPLE[:2])
        call(b, REWARDS[2:], PEOPLE[2:])
        a.merge_state(b)
        got, want = a.compute(), whole.compute()
        if isinstance(want, dict):
            assert got == pytest.approx(want)
        else:
            assert got.item() == pytest.approx(want.item())
    for state in ("correct", "total"):
        assert KKAccuracyPerN()._reductions[state].__name__ in ("dim_zero_sum", "sum")


def test_bad_updates():
    with pytest.raises(ValueError, match="rewards but"):
        KKAccuracyPerN().update([3.0, 3.0], [3])
    with pytest.raises(ValueError, match="n_people"):
        KKMetrics().update([3.0], [40])


def _ddp_worker(rank: int, world: int, init_file: str, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        m = KKMetrics()
        half = len(REWARDS) // world
        m.update(REWARDS[rank * half:(rank + 1) * half], PEOPLE[rank * half:(rank + 1) * half])
        queue.put((rank, m.compute()))  # compute() syncs the states across ranks
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # ~12 s: two spawned processes import torch
@pytest.mark.distributed
def test_ddp_sum_reduction_with_gloo(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), queue), nprocs=2, start_method="spawn")
    whole = KKMetrics()
    whole.update(REWARDS, PEOPLE)
    results = dict(queue.get(timeout=60) for _ in range(2))
    for rank in (0, 1):
        assert results[rank] == pytest.approx(whole.compute())
