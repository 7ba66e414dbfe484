"""The CLI on the tiny model: every command writes its PNG and JSON, labels synthetic advantages,
and ``reproduce --quick`` produces the whole figure set (sizes too small for the numbers to mean
anything; the SmolLM2 claims are in test_mechanisms.py)."""

from __future__ import annotations

import json

import pytest

from arlopti.analysis.__main__ import main

TINY = ["--model", "tiny", "--cold-start-steps", "0", "--prompts", "2", "--group-size", "2",
        "--max-new-tokens", "6", "--threads", "1"]


@pytest.mark.parametrize("command,stem", [("token-distribution", "token_distribution"), ("grad-norms", "grad_norms"), ("prob-shift", "prob_shift_sgd"),
                                          ("update-direction", "update_direction_sgd"),
                                          ("word-categories", "word_categories")])
def test_each_command_writes_png_and_json(command, stem, tmp_path):
    extra = ["--max-tokens", "4", "--max-sequences", "2"] if command == "grad-norms" else []
    main([command, *TINY, *extra, "--out", str(tmp_path), "--tb-dir", str(tmp_path / "tb")])
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert (tmp_path / f"{stem}.png").stat().st_size > 1000
    assert list((tmp_path / "tb").iterdir()), "nothing logged to TensorBoard"
    if command != "word-categories":
        # the raw tiny model fails the K&K format everywhere: advantages must say they are synthetic
        assert data["advantage_source"].startswith("synthetic")
        assert "SYNTHETIC" in data["caption"]


def test_dump_then_word_categories_from_it(tmp_path):
    main(["dump", *TINY, "--file", str(tmp_path / "d.jsonl.gz")])
    main(["word-categories", *TINY, "--dump", str(tmp_path / "d.jsonl.gz"), "--out", str(tmp_path)])
    data = json.loads((tmp_path / "word_categories.json").read_text())
    assert data["responses"] == 4 and data["source"].startswith("dump")


def test_reproduce_quick_writes_every_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("ARLOPTI_CACHE", str(tmp_path / "cache"))  # the sft setting's cold start
    args = [a for a in TINY if a not in ("--cold-start-steps", "0")]
    summary = main(["reproduce", *args, "--cold-start-steps", "1", "--quick", "--out", str(tmp_path)])
    for setting in ("raw", "sft"):
        for name in ("token_distribution", "grad_norms", "grad_norms_by_bucket", "prob_shift_sgd", "update_direction_sgd",
                     "update_direction_adamw"):
            assert (tmp_path / setting / f"{name}.png").exists(), (setting, name)
    assert (tmp_path / "sft" / "word_categories.png").exists()
    assert (tmp_path / "sft" / "rollouts_word_categories.jsonl.gz").exists()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["settings"]["raw"]["batch"]["advantage_source"].startswith("synthetic")
    assert set(saved["settings"]["sft"]["update_direction"]) == {"sgd", "adamw"}
    assert saved["timings_s"]["total"] == summary["timings_s"]["total"]


def test_split_reproduce_runs_merge_into_one_summary(tmp_path):
    """`--settings raw` then `--settings sft` keep both settings; a rerun replaces only its own."""
    from arlopti.analysis.reproduce import merge_summaries

    def run(names, tag, seconds):
        return {"settings": {n: {"tag": tag} for n in names}, "timings_s": {n: {"a": seconds} for n in names},
                "args": {"settings": ",".join(names)}, "load_avg_1_5_15_at_end": [0, 0, 0], "cpu_count": 2}

    path = tmp_path / "summary.json"
    first = merge_summaries(path, {**run(["raw"], "r1", 10.0), "timings_s": {"raw": {"a": 10.0}, "total": 11.0}},
                            ["raw"])
    path.write_text(json.dumps(first))
    second = merge_summaries(path, {**run(["sft"], "s1", 20.0), "timings_s": {"sft": {"a": 20.0}, "total": 21.0}},
                             ["sft"])
    assert second["settings"] == {"raw": {"tag": "r1"}, "sft": {"tag": "s1"}}
    assert second["timings_s"]["total"] == 30.0 and second["timings_s"]["this_run"] == 21.0
    assert second["runs"]["raw"]["args"] == {"settings": "raw"}
    path.write_text(json.dumps(second))
    third = merge_summaries(path, {**run(["raw"], "r2", 5.0), "timings_s": {"raw": {"a": 5.0}, "total": 6.0}},
                            ["raw"])
    assert third["settings"] == {"raw": {"tag": "r2"}, "sft": {"tag": "s1"}} and third["timings_s"]["total"] == 25.0
    path.write_text("{not json")
    assert set(merge_summaries(path, {**run(["raw"], "r3", 1.0), "timings_s": {"raw": {"a": 1.0}, "total": 1.0}},
                               ["raw"])["settings"]) == {"raw"}


def test_unknown_setting_fails_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="unknown setting 'sfft'"):
        main(["reproduce", *TINY, "--settings", "raw,sfft", "--out", str(tmp_path)])
    assert not (tmp_path / "raw").exists()
