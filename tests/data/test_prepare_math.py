"""``python -m arlopti.data.prepare dsr_uniform|deepscaler|orz``: sources and the output schema."""

import argparse
import gzip
import json

import pytest

from arlopti.data import prepare_math
from arlopti.tasks.math.readers import read_math_file
from arlopti.tasks.math.prompts import SUFFIX


def _main(argv):
    """What ``python -m arlopti.data.prepare`` does for the math sub-commands (the dispatcher
    itself also needs prepare_kk, which another module provides)."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="dataset", required=True)
    for name in prepare_math.DATASETS:
        prepare_math.add_arguments(sub.add_parser(name), name)
    return prepare_math.run(parser.parse_args(argv))


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_datasets_are_registered_in_the_dispatcher():
    assert prepare_math.DATASETS == ("dsr_uniform", "deepscaler", "orz")
    pytest.importorskip("arlopti.data.prepare_kk", reason="the dispatcher also imports prepare_kk")
    from arlopti.data import prepare

    args = prepare.build_parser().parse_args(["orz", "--input", "x.json", "--limit", "3"])
    assert (args.dataset, str(args.input), args.limit) == ("orz", "x.json", 3)
    assert str(args.output) == "data/prepared/orz/train.jsonl"


def test_orz_dialogues_convert(tmp_path):
    src = tmp_path / "orz_math_57k_collected.json"
    src.write_text(json.dumps([
        [{"from": "human", "value": "Compute 2+2."}, {"from": "assistant", "ground_truth": {"value": "4"}}],
        [{"from": "human", "value": "Half of 1?"},
         {"from": "assistant", "ground_truth": {"value": "\\frac{1}{2}"}}],
    ]))
    out = tmp_path / "out" / "train.jsonl"
    assert _main(["orz", "--input", str(src), "--output", str(out)]) == 0
    assert _lines(out) == [{"problem": "Compute 2+2.", "answer": "4"},
                           {"problem": "Half of 1?", "answer": "\\frac{1}{2}"}]


def test_arlopti_verl_parquet_converts(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"data_source": "deepscaler", "prompt": [{"role": "user", "content": "Find x if x+1=3." + SUFFIX}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
         "extra_info": {"split": "train", "index": 17, "difficulty": 42.1875}},
        {"data_source": "deepscaler", "prompt": [{"role": "user", "content": "What is 6*7?" + SUFFIX}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": "42"},
         "extra_info": {"split": "train", "index": 3, "difficulty": 0.78125}},
    ]
    src = tmp_path / "deepscaler_uniform_train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "train.jsonl"
    assert _main(["dsr_uniform", "--input", str(src), "--output", str(out)]) == 0
    assert _lines(out) == [
        {"problem": "Find x if x+1=3.", "answer": "2", "difficulty": 42.1875, "source_index": 17},
        {"problem": "What is 6*7?", "answer": "42", "difficulty": 0.78125, "source_index": 3},
    ]


def test_plain_jsonl_gz_with_lists_and_numbers(tmp_path):
    src = tmp_path / "src.jsonl.gz"
    with gzip.open(src, "wt") as fh:
        for row in ({"problem": "a", "answer": 142.0, "dsr_index": 5},
                    {"question": "b", "answer": ["1", "2"], "solution": "..."}):
            fh.write(json.dumps(row) + "\n")
    out = tmp_path / "o.jsonl"
    assert _main(["deepscaler", "--input", str(src), "--output", str(out), "--limit", "5"]) == 0
    assert _lines(out) == [{"problem": "a", "answer": 142.0, "source_index": 5},
                           {"problem": "b", "answer": ["1", "2"]}]
    assert read_math_file(out)[0].answer == 142.0


def test_dsr_uniform_default_reads_the_shared_fixture(tmp_path, monkeypatch):
    from arlopti.tasks.math.benchmarks import default_math_dir

    if not (default_math_dir() / prepare_math.DSR_UNIFORM_FIXTURE).exists():
        pytest.skip("shared DSR-Uniform fixture absent")
    out = tmp_path / "train.jsonl"
    assert _main(["dsr_uniform", "--output", str(out), "--limit", "10"]) == 0
    rows = _lines(out)
    assert len(rows) == 10 and set(rows[0]) == {"problem", "answer", "difficulty", "source_index"}
    assert not rows[0]["problem"].endswith(SUFFIX)


def test_offline_hub_suggests_input(tmp_path, capsys, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rc = _main(["deepscaler", "--output", str(tmp_path / "x.jsonl"),
                       "--hf-dataset", "arlopti-test/definitely-not-cached"])
    err = capsys.readouterr().err
    assert rc == 1 and "--input FILE" in err and "definitely-not-cached" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_no_source_and_bad_records(tmp_path, capsys):
    assert _main(["orz", "--output", str(tmp_path / "x.jsonl")]) == 1
    assert "--input FILE" in capsys.readouterr().err
    assert _main(["orz", "--input", str(tmp_path / "nope.json")]) == 1
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "a", "answer": "1"}) + "\n"
                   + json.dumps({"problem": "b", "answer": {"x": 1}}) + "\n")
    assert _main(["deepscaler", "--input", str(bad), "--output", str(tmp_path / "y.jsonl")]) == 1
    assert "bad.jsonl: record 1: the answer has an unsupported type dict" in capsys.readouterr().err
