"""Issue 52 row 6: with several ranks, a rank whose share of a validation set is empty (fewer prompts than ranks)
evaluates it like the others: every rank reports the same metrics, equal to one rank's evaluation of the whole
set (it used to end in a KeyError: its empty share had no ``format_rate``, its other sets had one)."""

from __future__ import annotations

import threading

import pytest
import torch

from arlopti.eval.runner import EvalMode, evaluate_sets
from arlopti.prompts.batch import PromptSample
from arlopti.rollout.engine import Completion, RolloutEngine
from arlopti.tasks.base import RewardResult, Task

pytestmark = pytest.mark.timeout(60)


class Echo(RolloutEngine):
    """Answers prompt ``[i]`` with ``script[i]``."""

    def __init__(self, script):
        super().__init__()
        self.script = script

    def generate(self, prompt_ids, n, sampling):
        return [[Completion([1], self.script[p[0]], "stop") for _ in range(n)] for p in prompt_ids]


class Exact(Task):
    def score(self, responses, gts, metas):
        return [RewardResult(1.0 if r == g else 0.0, r == g, {"format_ok": float(r != "")})
                for r, g in zip(responses, gts)]


class SumOverThreads:
    """An all-reduce (sum) among ``world`` threads, each one a rank: what ``trainer.strategy.reduce`` does."""

    def __init__(self, world: int):
        self.barrier, self.parts, self.lock = threading.Barrier(world, timeout=30), [], threading.Lock()

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.parts.append(t.clone())
        self.barrier.wait()
        total = torch.stack(self.parts).sum(0)
        self.barrier.wait()
        with self.lock:
            self.parts.clear()
        self.barrier.wait()
        return total


def sample(i, gt):
    return PromptSample([i], f"p{i}", gt, "t", f"u{i}")


def test_a_rank_with_an_empty_share_reports_what_every_rank_reports():
    script = {0: "a", 1: "x", 2: "c", 3: "d", 4: "e", 5: ""}
    # 3 ranks: "big" gives each rank 2 prompts, "one" has a single prompt (ranks 1 and 2 have none of it)
    sets = {"big": [sample(0, "a"), sample(1, "b"), sample(2, "c"), sample(3, "d"), sample(4, "z"), sample(5, "")],
            "one": [sample(2, "c")]}
    modes = {"t": (EvalMode(),)}
    whole, _ = evaluate_sets(Echo(script), sets, modes, lambda _: Exact(), 8)
    world, reduce_sum, out, errors = 3, SumOverThreads(3), {}, []

    def rank_main(rank: int) -> None:
        try:
            out[rank] = evaluate_sets(Echo(script), sets, modes, lambda _: Exact(), 8, rank=rank, world=world,
                                      reduce_sum=reduce_sum)[0]
        except BaseException as err:  # noqa: BLE001 - reported below, with its rank
            errors.append((rank, repr(err)))
            reduce_sum.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = {k: v for k, v in whole.items() if k != "timing/eval_s"}
    for rank in range(world):
        got = {k: v for k, v in out[rank].items() if k != "timing/eval_s"}
        assert got == pytest.approx(want), (rank, got, want)
    assert want["val/t/one/greedy/format_rate"] == 1.0 and want["val/t/big/greedy/format_rate"] == pytest.approx(5 / 6)
