"""``MetricSet``: declared kinds combine within a step and over ranks; the non-finite guard."""

from __future__ import annotations

import pytest
import torch

from arlopti.learner.guard import NonFiniteAbort, NonFiniteGuard
from arlopti.learner.metric_set import MetricSet
from arlopti.learner.step_metrics import add_objective_metrics


def test_kinds_combine_as_declared():
    m = MetricSet()
    m.add("a", 1.0, weight=1.0)
    m.add("a", 4.0, weight=3.0)
    m.add("n", 2.0, "sum")
    m.add("n", 5.0, "sum")
    m.add("hi", 2.0, "max")
    m.add("hi", 7.0, "max")
    m.add("lo", 2.0, "min")
    m.add("lo", -1.0, "min")
    assert m.as_dict() == {"a": (1 + 12) / 4, "hi": 7.0, "lo": -1.0, "n": 7.0}
    with pytest.raises(ValueError, match="declared 'sum'"):
        m.add("n", 1.0, "max")
    with pytest.raises(ValueError, match="kind 'median'"):
        m.add("x", 1.0, "median")


def test_objective_metrics_are_token_weighted_over_phases():
    m = MetricSet()
    add_objective_metrics(m, ["update", "update/low"], {"clip_frac_low": 0.5, "ratio_max": 1.2, "tokens": 2})
    add_objective_metrics(m, ["update", "update/high"], {"clip_frac_low": 0.0, "ratio_max": 1.1, "tokens": 6})
    add_objective_metrics(m, ["update", "update/high"], {"clip_frac_low": 1.0, "ratio_max": 9.9, "tokens": 0})
    d = m.as_dict()
    assert d["update/clip_frac_low"] == pytest.approx(0.5 * 2 / 8)  # the empty micro-batch weighs nothing
    assert d["update/ratio_max"] == 1.2 and d["update/high/ratio_max"] == 1.1  # no token: no extreme
    assert d["update/tokens"] == 8 and d["update/low/tokens"] == 2


def test_reduce_over_ranks_follows_the_kinds(monkeypatch):
    import torch.distributed as dist

    # two ranks, simulated: the other rank's vectors are added in by the stand-in all-reduce
    other = MetricSet()
    other.add("m", 3.0, weight=3.0)
    other.add("s", 10.0, "sum")
    other.add("only_other", 1.0)
    mine = MetricSet()
    mine.add("m", 1.0, weight=1.0)
    mine.add("s", 1.0, "sum")
    mine.add("x", 4.0, "max")

    def gather(out, obj):
        out[0], out[1] = obj, sorted(other._kind.items())

    monkeypatch.setattr(dist, "all_gather_object", gather)
    names = sorted({"m", "s", "x", "only_other"})  # the union of both ranks' keys
    out = mine.reduce_over_ranks(_two_rank_reduce(mine, other, names), 2, "cpu")
    assert out["m"] == pytest.approx((1 + 9) / 4) and out["s"] == 11.0 and out["x"] == 4.0
    assert out["only_other"] == 1.0


def _two_rank_reduce(mine, other, names):
    calls = {"n": 0}

    def reduce(t, op):
        i = calls["n"]
        calls["n"] += 1
        o = _vectors(other, names)[i]
        return torch.maximum(t, o) if op == "max" else torch.minimum(t, o) if op == "min" else t + o
    return reduce


def _vectors(ms, names):
    kinds = {k: v for k, v in ms._kind.items()}
    num = [ms._num[k] if k in ms._num and kinds[k] in ("mean", "sum") else 0.0 for k in names]
    den = [ms._den[k] if k in ms._num and kinds[k] == "mean" else 0.0 for k in names]
    hi = [ms._num[k] if k in ms._num and kinds[k] == "max" else -float("inf") for k in names]
    lo = [ms._num[k] if k in ms._num and kinds[k] == "min" else float("inf") for k in names]
    return [torch.tensor(v, dtype=torch.float64) for v in (num, den, hi, lo)]


def test_guard_skips_then_aborts_and_round_trips():
    g = NonFiniteGuard(max_consecutive=2)
    assert g.allow(True, loss=1.0, grad_norm=1.0, rollout_step=0)
    assert not g.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=3)
    assert g.allow(True, loss=1.0, grad_norm=1.0, rollout_step=3) and g.consecutive == 0 and g.total == 1
    assert not g.allow(False, loss=1.0, grad_norm=float("inf"), rollout_step=4)
    with pytest.raises(NonFiniteAbort, match=r"2 consecutive .*grad_norm=inf\) at rollout step 5"):
        g.allow(False, loss=1.0, grad_norm=float("inf"), rollout_step=5)
    h = NonFiniteGuard(2)
    h.load_state_dict(g.state_dict())
    assert (h.total, h.consecutive) == (3, 2)
