"""The evaluation runner on a scripted engine: metric values and names by hand."""

from __future__ import annotations

import pytest
import torch

from arlopti.prompts.batch import PromptSample
from arlopti.eval.runner import EvalMode, evaluate_sets
from arlopti.rollout.engine import Completion, RolloutEngine
from arlopti.tasks.base import RewardResult, Task


class Scripted(RolloutEngine):
    """Answers prompt i, sample j with the text in script[prompt_ids[0]][j]."""

    def __init__(self, script):
        super().__init__()
        self.script = script
        self.calls = []

    def generate(self, prompt_ids, n, sampling):
        self.calls.append((len(prompt_ids), n, sampling.temperature))
        return [[Completion([1], self.script[p[0]][j], "stop") for j in range(n)] for p in prompt_ids]


class Exact(Task):
    def score(self, responses, gts, metas):
        return [RewardResult(1.0 if r == g else 0.0, r == g, {"format_ok": float(r != "")}) for r, g in zip(responses, gts)]


def sample(i, gt):
    return PromptSample([i], f"p{i}", gt, "t", f"u{i}")


def test_avg_and_pass_at_k_by_hand():
    # 3 problems x 4 samples: correct counts 2, 0, 4 -> avg@4 = 6/12, pass@4 = 2/3
    script = {0: ["a", "x", "a", "x"], 1: ["x"] * 4, 2: ["c"] * 4}
    sets = {"s": [sample(0, "a"), sample(1, "b"), sample(2, "c")]}
    m, res = evaluate_sets(Scripted(script), sets, {"t": (EvalMode("samp", 1.0, 1.0, -1, 4),)}, lambda _: Exact(), 8)
    assert m["val/t/s/samp/avg@4"] == pytest.approx(0.5)
    assert m["val/t/s/samp/pass@4"] == pytest.approx(2 / 3)
    assert m["val/t/s/samp/reward"] == pytest.approx(0.5)
    assert m["val/t/mean/samp/avg@4"] == pytest.approx(0.5)
    assert res[0].problems == 3 and res[0].n == 4


def test_single_sample_modes_report_acc_and_mean_over_sets():
    script = {0: ["a"], 1: ["x"], 2: ["c"]}
    sets = {"one": [sample(0, "a"), sample(1, "b")], "two": [sample(2, "c")]}
    modes = {"t": (EvalMode("greedy", 0.0), EvalMode("sampling", 1.0))}
    eng = Scripted(script)
    m, _ = evaluate_sets(eng, sets, modes, lambda _: Exact(), 8, limit=None)
    assert m["val/t/one/greedy/acc"] == pytest.approx(0.5)
    assert m["val/t/two/sampling/acc"] == pytest.approx(1.0)
    assert m["val/t/mean/greedy/acc"] == pytest.approx(0.75)  # unweighted mean over sets
    assert m["val/t/one/greedy/format_rate"] == pytest.approx(1.0)
    assert [c[2] for c in eng.calls] == [0.0, 1.0, 0.0, 1.0]


def test_ranks_split_prompts_and_reduce_sums():
    script = {i: ["a" if i % 2 == 0 else "x"] for i in range(6)}
    sets = {"s": [sample(i, "a") for i in range(6)]}
    parts = []
    for rank in (0, 1):
        eng = Scripted(script)
        evaluate_sets(eng, sets, {"t": (EvalMode(),)}, lambda _: Exact(), 8, rank=rank, world=2,
                      reduce_sum=lambda t: (parts.append(t.clone()), t)[1])
        assert eng.calls[0][0] == 3  # each rank generates for half of the prompts
    total = parts[0] + parts[1]
    assert total[0].item() == 6 and total[1].item() == 3  # problems, correct


def test_an_empty_set_is_an_error_and_the_mean_says_what_it_averages(caplog):
    """Issue 14 row 6: an empty set used to drop out of val/<task>/mean silently; now the mean says
    how many sets it is over and names them, and a dropped set is named."""
    import logging

    script = {0: ["a"], 1: ["x"], 2: ["c"]}
    sets = {"one": [sample(0, "a"), sample(1, "b")], "two": [sample(2, "c")]}
    with caplog.at_level(logging.INFO, logger="arlopti.eval.runner"):
        m, _ = evaluate_sets(Scripted(script), sets, {"t": (EvalMode(),)}, lambda _: Exact(), 8)
    assert m["val/t/mean/sets"] == 2.0
    assert "val/t/mean averages over 2 set(s): one, two" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="arlopti.eval.runner"):
        m, _ = evaluate_sets(Scripted(script), {**sets, "two": []}, {"t": (EvalMode(),)}, lambda _: Exact(), 8)
    assert m["val/t/mean/sets"] == 1.0 and m["val/t/mean/greedy/acc"] == 0.5
    assert "validation set(s) ['two'] hold no prompts: not evaluated" in caplog.text
    assert "val/t/mean averages over 1 set(s): one" in caplog.text
    with pytest.raises(ValueError, match="limit=0"):
        evaluate_sets(Scripted(script), sets, {"t": (EvalMode(),)}, lambda _: Exact(), 8, limit=0)


def test_keep_items_records_every_response_in_order():
    """keep_items: one record per (prompt, sample), uid/set/mode/sample/reward/correct/answer/response;
    the answer is the task's extract_answer (None for a task without one)."""
    class WithAnswer(Exact):
        def extract_answer(self, response):
            return response.upper()

    script = {0: ["a", "x"], 1: ["b", "b"]}
    sets = {"s": [sample(0, "a"), sample(1, "b")]}
    _, res = evaluate_sets(Scripted(script), sets, {"t": (EvalMode("samp", 1.0, 1.0, -1, 2),)},
                           lambda _: WithAnswer(), 8, keep_items=True)
    assert [(r["uid"], r["sample"], r["response"], r["correct"], r["answer"]) for r in res[0].items] == [
        ("u0", 0, "a", True, "A"), ("u0", 1, "x", False, "X"), ("u1", 0, "b", True, "B"), ("u1", 1, "b", True, "B")]
    assert {r["set"] for r in res[0].items} == {"s"} and {r["mode"] for r in res[0].items} == {"samp"}
    assert [r["reward"] for r in res[0].items] == [1.0, 0.0, 1.0, 1.0]
    # the reward's named parts (for task=custom, every extra key it returned) reach the records
    assert [r["components"] for r in res[0].items] == [{"format_ok": 1.0}] * 4
    _, res = evaluate_sets(Scripted(script), sets, {"t": (EvalMode("samp", 1.0, 1.0, -1, 2),)}, lambda _: Exact(), 8,
                           keep_items=True)
    assert res[0].items[0]["answer"] is None
    _, res = evaluate_sets(Scripted(script), sets, {"t": (EvalMode("samp", 1.0, 1.0, -1, 2),)}, lambda _: Exact(), 8)
    assert res[0].items == []  # off by default (validation during training)
