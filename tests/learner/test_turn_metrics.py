"""The turns/* tags on a hand-built two-episode step (arlopti.learner.turn_metrics)."""

from __future__ import annotations

import math

import torch

from arlopti.learner.experience import build_experience
from arlopti.learner.metric_set import MetricSet
from arlopti.learner.turn_metrics import HEAD_TOKENS, add_turn_metrics, segments
from arlopti.rollout.episode import Episode
from arlopti.tasks.base import RewardResult


def episode(trainable, turns, **meta):
    n = len(trainable)
    return Episode(list(range(10, 10 + n)), trainable, "x", "stop", logprobs=[-0.1 * m for m in trainable],
                   meta={"turns": turns, "tool_calls": 0, "env_steps": turns - 1, "tool_errors": 0, "tool_timeouts": 0,
                         "env_tokens": n - sum(trainable), "env_s": 0.5, **meta})


def test_segments_and_the_numbers_by_hand():
    # episode 0: turn 0 (3 tokens), a reply (2), turn 1 (10), a reply (1), turn 2 (2); episode 1: one turn of 4
    a = [1] * 3 + [0] * 2 + [1] * 10 + [0] + [1] * 2
    b = [1] * 4
    drifted = episode(a, 3, retokenize_diff=1, retokenize_diff_tokens=5)
    exp = build_experience([[1, 2], [1, 2]], [[drifted, episode(b, 1)]],
                           [RewardResult(1.0, True), RewardResult(0.0, False)], pad_id=0)
    seg = segments(exp.turn_index)
    assert [int(seg[k].sum()) for k in ("first_turn", "later_turns", "after_reply", "rest")] == [7, 12, 10, 9]
    assert HEAD_TOKENS == 8 and bool(seg["after_reply"][0, 5:13].all()) and not bool(seg["after_reply"][0, 13])
    # p_old: 0.1 on episode 0's turn-1 head, 0.9 elsewhere; |A| = 1 everywhere
    old = torch.full(exp.response_mask.shape, math.log(0.9))
    old[0, 5:13] = math.log(0.1)
    adv = exp.response_mask.clone()
    m = MetricSet()
    add_turn_metrics(m, exp, old, adv, threshold=0.5)
    v = m.as_dict()
    assert v["turns/mean"] == 2.0 and v["turns/max"] == 3.0 and v["turns/env_steps"] == 2.0
    assert v["turns/tool_calls"] == 0.0  # a text environment's steps are no tool calls
    assert v["turns/env_token_frac"] == 3 / 22 and v["turns/retokenize_diff_frac"] == 0.5
    assert v["turns/retokenize_diff_tokens"] == 5
    assert v["turns/reward/3"] == 1.0 and v["turns/reward/1"] == 0.0 and v["timing/env_s"] == 1.0
    assert abs(v["turns/after_reply/low_prob_frac"] - 8 / 10) < 1e-7 and v["turns/rest/low_prob_frac"] == 0.0
    assert abs(v["turns/later_turns/low_prob_frac"] - 8 / 12) < 1e-7 and v["turns/first_turn/tokens"] == 7
    # gradient mass |A|(1 - p): 0.9 per head token, 0.1 per other token
    total = 8 * 0.9 + 11 * 0.1
    assert abs(v["turns/after_reply/grad_mass_frac"] - (8 * 0.9 + 2 * 0.1) / total) < 1e-6
    assert abs(v["turns/after_reply/grad_mass_frac"] + v["turns/rest/grad_mass_frac"] - 1) < 1e-6
    assert abs(v["turns/after_reply/grad_mass_share/0.00-0.25"] - 7.2 / 7.4) < 1e-6
    assert v["turns/first_turn/grad_mass_share/0.75-1.00"] == 1.0
    # engine log-probs 0.1 below on the head: |logπ_old − logπ_engine| = 0.1 there, as built by the episodes
    assert "turns/after_reply/mismatch_abs_diff_mean" in v


def test_a_single_turn_step_adds_no_turn_tag():
    exp = build_experience([[1]], [[Episode([5, 6], [1, 1], "x", "stop")]], [RewardResult(0.0, False)], pad_id=0)
    m = MetricSet()
    add_turn_metrics(m, exp, torch.zeros(1, 2), torch.zeros(1, 2), threshold=0.5)
    assert exp.turn_index is None and m.as_dict() == {}


def test_every_turn_tag_is_a_row_of_the_metrics_docs_and_every_row_is_written():
    import re

    from conftest import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "metrics.md").read_text()
    rows = [m.group(1) for m in re.finditer(r"^\| `(turns/[^`]+)` \|", doc, re.M)]
    patterns = [re.compile(re.sub(r"<[a-z]+>", "[^/]+", re.escape(r).replace(r"\<", "<").replace(r"\>", ">")) + "$")
                for r in rows]
    a = [1] * 3 + [0] * 2 + [1] * 10 + [0] + [1] * 2
    exp = build_experience([[1, 2], [1, 2]], [[episode(a, 3), episode([1] * 4, 1)]],
                           [RewardResult(1.0, True), RewardResult(0.0, False)], pad_id=0)
    m = MetricSet()
    add_turn_metrics(m, exp, torch.full(exp.response_mask.shape, -0.3), exp.response_mask.clone(), threshold=0.5)
    tags = [t for t in m.as_dict() if t.startswith("turns/")]
    assert [t for t in tags if not any(p.match(t) for p in patterns)] == []
    assert [r for r, p in zip(rows, patterns) if not any(p.match(t) for t in tags)] == []
    assert "timing/env_s" in m.as_dict() and "`env_s`" in doc
