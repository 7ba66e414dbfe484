"""``python -m arlopti.data.prepare kk``: sources, split rules, output layout, clear errors."""

from __future__ import annotations

import argparse
import gzip
import json

import pytest
from conftest import need_fixture

from arlopti.data import prepare_kk
from arlopti.tasks.kk.puzzle import Puzzle

FIELDS = ("quiz", "names", "solution", "solution_text", "solution_text_format", "statements", "index",
          "n_people")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    prepare_kk.add_arguments(parser)
    return prepare_kk.run(parser.parse_args(argv))


def lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(x) for x in fh]


def test_parse_people():
    assert prepare_kk.parse_people("3-7") == [3, 4, 5, 6, 7]
    assert prepare_kk.parse_people("8,2,3-4,3") == [2, 3, 4, 8]
    for bad in ("1-3", "x", "7-3", "13"):
        with pytest.raises(argparse.ArgumentTypeError, match="--people"):
            prepare_kk.parse_people(bad)


def test_generated(tmp_path):
    out = tmp_path / "gen"
    assert run(["--people", "3,4", "--train-count", "30", "--test-count", "10", "--out", str(out)]) == 0
    train = lines(out / "train.jsonl")
    assert [r["n_people"] for r in train] == [3] * 30 + [4] * 30
    assert [r["index"] for r in train[:3]] == [100, 101, 102]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test_3ppl.jsonl", "test_4ppl.jsonl",
                                                     "train.jsonl"]
    test3 = lines(out / "test_3ppl.jsonl")
    assert [r["index"] for r in test3] == list(range(130, 140))
    for r in train + test3:
        assert set(r) == set(FIELDS)
        Puzzle.from_record(r, verify=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 1234 and manifest["counts"]["4ppl"] == {"train": 30, "test": 10}
    # Same command, same bytes.
    again = tmp_path / "again"
    run(["--people", "3,4", "--train-count", "30", "--test-count", "10", "--out", str(again)])
    assert (again / "train.jsonl").read_bytes() == (out / "train.jsonl").read_bytes()


def test_generated_logic_equals_official_split(tmp_path):
    fixture = need_fixture("kk/kk_test_3ppl.jsonl")
    out = tmp_path / "gen"
    assert run(["--people", "3", "--out", str(out)]) == 0  # defaults: skip 100, 900/100
    ours, official = lines(out / "test_3ppl.jsonl"), lines(fixture)
    assert [(r["statements"], r["solution"], r["index"]) for r in ours] == \
        [(r["statements"], r["solution"], r["index"]) for r in official]
    assert ours[0]["quiz"] != official[0]["quiz"]  # the English is ours


def test_files_fixture_layout_reproduces_the_fixture(tmp_path):
    kk = need_fixture("kk")
    need_fixture("kk/kk_train_34567ppl.jsonl.gz")
    out = tmp_path / "files"
    assert run(["--source", "files", "--input-dir", str(kk), "--out", str(out)]) == 0
    train, fixture_train = lines(out / "train.jsonl"), lines(kk / "kk_train_34567ppl.jsonl.gz")
    assert len(train) == 4500
    kept = FIELDS + ("prompt",)  # the official prompt string travels with the record, verbatim
    assert [{f: r[f] for f in kept} for r in train] == [{f: r[f] for f in kept} for r in fixture_train]
    for n in range(3, 8):
        got, want = lines(out / f"test_{n}ppl.jsonl"), lines(kk / f"kk_test_{n}ppl.jsonl")
        assert [{f: r[f] for f in kept} for r in got] == [{f: r[f] for f in kept} for r in want]
    # ... so the output serves the official template (configs/data/kk.yaml with data_dir: out).
    from arlopti.data.kk_datamodule import KKDataModule

    val = KKDataModule(source="official", data_dir=str(out), template="official", val_people=[6],
                       verify_solutions=False).val_records()["kk_6ppl"]
    assert [r.text for r in val] == [r["prompt"] for r in lines(kk / "kk_test_6ppl.jsonl")]


def test_files_per_n_layout_uses_the_logic_rl_split(tmp_path):
    kk = need_fixture("kk")
    # Rebuild an official people3_num1000.jsonl: 900 train rows then 100 test rows (indices 100..1099).
    train3 = [r for r in lines(kk / "kk_train_34567ppl.jsonl.gz") if r["n_people"] == 3]
    test3 = lines(kk / "kk_test_3ppl.jsonl")
    src = tmp_path / "hf"
    src.mkdir()
    with open(src / "people3_num1000.jsonl", "w") as fh:
        for r in train3 + test3:
            fh.write(json.dumps({k: v for k, v in r.items() if k != "n_people"}) + "\n")
    out = tmp_path / "out"
    assert run(["--source", "files", "--input-dir", str(src), "--people", "3", "--out", str(out)]) == 0
    assert [r["index"] for r in lines(out / "train.jsonl")] == list(range(100, 1000))
    assert [r["statements"] for r in lines(out / "test_3ppl.jsonl")] == [r["statements"] for r in test3]
    # Asking for more rows than the file has is a clear error.
    assert run(["--source", "files", "--input-dir", str(src), "--people", "3", "--test-count", "200",
                "--out", str(tmp_path / "o2")]) == 2


def test_hf_offline_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'K-and-K/knights-and-knaves' on the Hub "
                              "(LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert run(["--source", "hf", "--people", "3", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "K-and-K/knights-and-knaves" in err and "network" in err and "--source files" in err
    assert not (tmp_path / "hf").exists()


def test_hf_rows_are_split_like_logic_rl(tmp_path, monkeypatch):
    kk = need_fixture("kk")
    rows = [r for r in lines(kk / "kk_train_34567ppl.jsonl.gz") if r["n_people"] == 4] + \
        lines(kk / "kk_test_4ppl.jsonl")
    monkeypatch.setattr(prepare_kk, "load_hf_file", lambda n: rows if n == 4 else [])
    out = tmp_path / "hf"
    assert run(["--source", "hf", "--people", "4", "--out", str(out)]) == 0
    assert len(lines(out / "train.jsonl")) == 900
    assert [r["index"] for r in lines(out / "test_4ppl.jsonl")] == list(range(1000, 1100))


def test_user_errors(tmp_path, capsys):
    assert run(["--source", "files", "--out", str(tmp_path / "a")]) == 2
    assert "--input-dir" in capsys.readouterr().err
    assert run(["--source", "files", "--input-dir", str(tmp_path / "nope"),
                "--out", str(tmp_path / "b")]) == 2
    assert "nope" in capsys.readouterr().err
    out = tmp_path / "c"
    assert run(["--people", "3,4", "--train-count", "2", "--test-count", "1", "--out", str(out)]) == 0
    assert run(["--people", "3", "--train-count", "2", "--test-count", "1", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert run(["--people", "3", "--train-count", "2", "--test-count", "1", "--out", str(out),
                "--overwrite"]) == 0
    assert not (out / "test_4ppl.jsonl").exists()  # stale set removed
    with pytest.raises(SystemExit):
        run(["--people", "1-3"])


def test_dispatcher(tmp_path):
    from arlopti.data import prepare

    out = tmp_path / "d"
    assert prepare.main(["kk", "--people", "2", "--train-count", "3", "--test-count", "2",
                         "--out", str(out)]) == 0
    assert len(lines(out / "train.jsonl")) == 3


def test_datamodule_reads_prepared_output(tmp_path, tiny_tokenizer):
    from arlopti.data.kk_datamodule import KKDataModule

    out = tmp_path / "p"
    assert run(["--people", "3,5", "--train-count", "8", "--test-count", "3", "--out", str(out)]) == 0
    dm = KKDataModule(tokenizer=tiny_tokenizer, source="official", data_dir=str(out), prompts_per_step=4,
                      max_prompt_length=4096)
    dm.setup()
    assert len(dm.train_samples) == 16 and sorted(dm.val_sets) == ["kk_3ppl", "kk_5ppl"]
