"""``python -m arlopti.eval.compare``: hand-checked numbers on a small fixture, an identical pair,
mismatched files, avg@k, and end to end on two real ``eval.py`` results."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from arlopti.eval.compare import CompareError, compare, main, mcnemar_exact

# 10 greedy items. A right on u0..u4, B right on u2..u8:
#   A only (b) = {u0, u1} = 2, B only (c) = {u5, u6, u7, u8} = 4, both = 3, neither = {u9}.
A = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
B = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0]


def items(correct, set_name="s1", mode="greedy", k=1, uid_prefix="u"):
    """Item records as eval.py writes them; ``correct[i]`` is a 0/1 or a list of k of them."""
    out = []
    for i, c in enumerate(correct):
        for j, ok in enumerate(c if isinstance(c, list) else [c]):
            out.append({"uid": f"{uid_prefix}{i}", "set": set_name, "mode": mode, "sample": j,
                        "reward": float(ok), "correct": bool(ok), "answer": None})
    return out


def write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text(json.dumps({"items": records}))
    return p


def test_mcnemar_exact_by_hand():
    # b=2, c=4: 2 * P(X <= 2), X ~ Bin(6, 1/2) = 2 * (1 + 6 + 15) / 64 = 44/64
    assert mcnemar_exact(2, 4) == pytest.approx(44 / 64)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 * 1/32
    assert mcnemar_exact(3, 3) == 1.0  # 2 * 42/64 > 1 -> capped
    assert mcnemar_exact(0, 0) == 1.0


def test_hand_checked_fixture(tmp_path):
    res = compare(write(tmp_path, "a.json", items(A)), write(tmp_path, "b.json", items(B)))
    row, overall = res["modes"]["greedy"]
    assert row["a"] == pytest.approx(0.5) and row["b"] == pytest.approx(0.7)
    assert row["diff"] == pytest.approx(0.2)  # (7 - 5) / 10
    assert row["mcnemar"] == {"a_only": 2, "b_only": 4, "p": pytest.approx(0.6875)}
    # the CI against a direct numpy computation: same generator, items drawn with replacement
    d = np.array(B, float) - np.array(A, float)
    idx = np.random.default_rng(0).integers(0, 10, size=(10_000, 10))
    lo, hi = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
    assert row["ci95"] == [pytest.approx(lo), pytest.approx(hi)]
    assert lo < 0.2 < hi
    assert overall["set"] == "overall" and overall["diff"] == pytest.approx(0.2)
    assert overall["ci95"] == row["ci95"]  # one set: the mean over sets is that set


def test_identical_pair_has_ci_around_zero_and_p_one(tmp_path):
    a = write(tmp_path, "a.json", items(A) + items(B, set_name="s2"))
    b = write(tmp_path, "b.json", items(A) + items(B, set_name="s2"))
    for row in compare(a, b)["modes"]["greedy"]:
        assert row["diff"] == 0.0
        assert row["ci95"][0] <= 0.0 <= row["ci95"][1]
        assert row["mcnemar"]["p"] == 1.0


def test_overall_is_the_mean_over_sets_and_mcnemar_sums_the_sets(tmp_path):
    # s1: A/B as above (diff +0.2); s2 of 4 items: A right on all, B on none (diff -1, b=4, c=0)
    a = write(tmp_path, "a.json", items(A) + items([1, 1, 1, 1], set_name="s2", uid_prefix="v"))
    b = write(tmp_path, "b.json", items(B) + items([0, 0, 0, 0], set_name="s2", uid_prefix="v"))
    rows = compare(a, b)["modes"]["greedy"]
    assert [r["set"] for r in rows] == ["s1", "s2", "overall"]
    assert rows[1]["ci95"] == [pytest.approx(-1.0), pytest.approx(-1.0)]
    assert rows[2]["diff"] == pytest.approx((0.2 - 1.0) / 2)
    assert rows[2]["mcnemar"]["a_only"] == 6 and rows[2]["mcnemar"]["b_only"] == 4
    assert rows[2]["mcnemar"]["p"] == pytest.approx(mcnemar_exact(6, 4))


def test_avg_at_k_resamples_items_and_has_no_mcnemar(tmp_path):
    # 3 items x 4 samples: item scores A = (0.5, 0, 1), B = (1, 0.25, 1) -> avg@4 0.5 vs 0.75
    a = write(tmp_path, "a.json", items([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], mode="sampling"))
    b = write(tmp_path, "b.json", items([[1, 1, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]], mode="sampling"))
    row = compare(a, b)["modes"]["sampling"][0]
    assert row["metric"] == "avg@4" and row["k"] == 4
    assert row["diff"] == pytest.approx(0.25)
    assert row["mcnemar"] is None
    d = np.array([0.5, 0.25, 0.0])  # per-item differences; resampled as whole items
    idx = np.random.default_rng(0).integers(0, 3, size=(10_000, 3))
    assert row["ci95"] == pytest.approx(list(np.percentile(d[idx].mean(axis=1), [2.5, 97.5])))


def test_mismatched_items_name_the_file(tmp_path):
    a = write(tmp_path, "a.json", items(A))
    b = write(tmp_path, "short.json", items(B[:8]))
    with pytest.raises(CompareError, match=r"set 's1' \(greedy\): the items differ: 10 in .*a\.json, 8 in .*short\.json"):
        compare(a, b)
    other_set = write(tmp_path, "other.json", items(B, set_name="s9"))
    with pytest.raises(CompareError, match=r"a\.json has sets \[.s1.\], .*other\.json has \[.s9.\]"):
        compare(a, other_set)
    more_k = write(tmp_path, "k2.json", items([[c, c] for c in B]))
    with pytest.raises(CompareError, match="samples per item differ"):
        compare(a, more_k)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"metrics": {}}))
    with pytest.raises(CompareError, match=r"old\.json: no per-item records"):
        compare(a, old)


def test_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = main([str(write(tmp_path, "a.json", items(A))), str(write(tmp_path, "b.json", items(B))), "--out", str(out)])
    assert rc == 0
    assert "0.6875" in capsys.readouterr().out
    assert json.loads(out.read_text())["modes"]["greedy"][0]["mcnemar"]["p"] == pytest.approx(0.6875)
    assert main([str(tmp_path / "a.json"), str(write(tmp_path, "s.json", items(B[:3])))]) == 2
    assert "s.json" in capsys.readouterr().err


def test_two_real_eval_runs_compare(tmp_path):
    """eval.py writes every item (uid, set, mode, sample, reward, correct, answer; responses in
    eval_items.jsonl.gz), and two runs of it compare."""
    from conftest import FIXTURES
    from helpers.compose import compose_eval

    from arlopti.eval.runner import read_items
    from arlopti.entry.evaluate import evaluate

    if not (FIXTURES / "math" / "math500.jsonl").exists():
        pytest.skip("the shared math fixtures are absent")
    paths = []
    for run in ("a", "b"):
        cfg = compose_eval(tmp_path / run, ["eval.limit=3", "eval.benchmarks=[math500]", "eval.samples_per_problem=2",
                                            "rollout.max_new_tokens=4", f"eval.data_dir={FIXTURES / 'math'}"])
        report = evaluate(cfg)
        paths.append(tmp_path / run / "eval_results.json")
        assert len(report["items"]) == 3 * 2
        assert set(report["items"][0]) == {"uid", "set", "mode", "sample", "reward", "correct", "answer",
                                            "components"}
    full = read_items(paths[0])
    assert (paths[0].parent / "eval_items.jsonl.gz").is_file() and len(full) == 6
    assert all(isinstance(r["response"], str) for r in full) and [r["sample"] for r in full[:2]] == [0, 1]
    res = compare(*paths)
    row = res["modes"]["sampling"][0]
    assert row["metric"] == "avg@2" and row["items"] == 3 and row["mcnemar"] is None
    assert math.isclose(row["diff"], row["b"] - row["a"])


@pytest.mark.parametrize("field, value, expected", [
    ("correct", "false", "true or false (a JSON boolean)"),
    ("correct", 0.5, "true or false (a JSON boolean)"),
    ("correct", None, "true or false (a JSON boolean)"),
    ("correct", 1, "true or false (a JSON boolean)"),
    ("sample", -1, "an integer >= 0"),
    ("sample", "0", "an integer >= 0"),
    ("uid", True, "a non-empty string or an integer"),
    ("set", None, "a non-empty string"),
    ("reward", float("nan"), "a finite number"),
])
def test_an_item_with_a_bad_field_is_refused_naming_file_item_and_field(field, value, expected, tmp_path, capsys):
    """An all-wrong B whose `correct` became the string "false" used to score 1.0 (issue 24, §3)."""
    a = write(tmp_path, "a.json", items([0] * 10))
    bad = items([0] * 10)
    bad[3][field] = value
    b = tmp_path / "edited.json"
    b.write_text(json.dumps({"items": bad}))
    rc = main([str(a), str(b), "--out", str(tmp_path / "cmp.json")])
    err = capsys.readouterr().err
    assert rc == 2
    uid = f" (uid {bad[3]['uid']!r})"
    assert f"{b}: item 3{uid}: field {field!r} is {json.dumps(value)}, expected {expected}" in err
    assert not (tmp_path / "cmp.json").exists()


def test_an_item_without_a_field_is_refused_naming_it(tmp_path):
    a = write(tmp_path, "a.json", items(A))
    bad = items(B)
    del bad[0]["correct"]
    with pytest.raises(CompareError, match=r"b\.json: item 0 \(uid 'u0'\): field 'correct' is missing"):
        compare(a, write(tmp_path, "b.json", bad))
