"""The benchmark registry: names, sizes, answer types, uids, and clear errors."""

import json
import re

import pytest

from arlopti.tasks.math.benchmarks import BENCHMARKS, default_math_dir, list_benchmarks, load_benchmark

SIZES = {"aime24": 30, "amc83": 83, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 675}


def _need(name):
    path = default_math_dir() / BENCHMARKS[name].filename
    if not path.exists():
        pytest.skip(f"shared fixture {path} is absent (set ARLOPTI_SHARED to the folder holding fixtures/)")


def test_names():
    assert list_benchmarks() == ["aime24", "amc83", "amc23", "math500", "minerva", "olympiadbench"]


def test_default_dir_follows_arlopti_shared(monkeypatch, tmp_path):
    monkeypatch.setenv("ARLOPTI_SHARED", str(tmp_path))
    assert default_math_dir() == tmp_path / "fixtures" / "math"


@pytest.mark.parametrize("name", list(SIZES))
def test_sizes_and_answer_types(name):
    _need(name)
    items = load_benchmark(name)
    assert len(items) == SIZES[name]
    assert [it.uid for it in items[:2]] == [f"math/{name}/0", f"math/{name}/1"]
    assert all(it.problem for it in items)
    kinds = {type(it.answer) for it in items}
    expected = {"amc83": {float}, "amc23": {float}, "minerva": {list}, "olympiadbench": {list}}
    expected = expected.get(name, {str})
    assert kinds == expected


def test_amc23_is_a_subset_of_amc83():
    _need("amc23")
    _need("amc83")
    big = {it.problem.strip() for it in load_benchmark("amc83")}
    small = [it.problem.strip() for it in load_benchmark("amc23")]
    assert sum(p in big for p in small) >= 30  # the notes found all 40; texts differ in whitespace


def test_limit_and_data_dir(tmp_path):
    (tmp_path / "aime2024.jsonl").write_text(
        "".join(json.dumps({"problem": f"p{i}", "answer": str(i)}) + "\n" for i in range(5)))
    items = load_benchmark("aime24", data_dir=tmp_path, limit=3)
    assert [(it.problem, it.answer, it.uid) for it in items] == [
        ("p0", "0", "math/aime24/0"), ("p1", "1", "math/aime24/1"), ("p2", "2", "math/aime24/2")]


def test_missing_file_names_the_local_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/minerva_math.jsonl.*no hub source"):
        load_benchmark("minerva", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/math500.jsonl.*offline"):
        load_benchmark("math500", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="disabled"):
        load_benchmark("math500", data_dir=tmp_path, allow_hub=False)


def test_unknown_name():
    with pytest.raises(KeyError, match="aime24"):
        load_benchmark("aime25")


def test_an_empty_or_short_validation_benchmark_is_never_silent(tmp_path, caplog):
    """Issue 14 row 6, math: an empty benchmark file is an error naming it; a short one is logged."""
    import logging

    from arlopti.data.math_datamodule import MathDataModule
    from arlopti.tasks.math.benchmarks import BENCHMARKS

    train = tmp_path / "train.jsonl"
    train.write_text('{"problem": "1+1?", "answer": "2"}\n')
    bench = tmp_path / BENCHMARKS["math500"].filename
    bench.write_text("")
    dm = MathDataModule(train_file=str(train), val_benchmarks=["math500"], val_data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=rf"'math500': {re.escape(str(bench))} holds no problems"):
        dm.val_records()
    bench.write_text('{"problem": "2+2?", "answer": "4"}\n' * 3)
    dm = MathDataModule(train_file=str(train), val_benchmarks=["math500"], val_data_dir=str(tmp_path), val_limit=5)
    with caplog.at_level(logging.WARNING):
        assert len(dm.val_records()["math500"]) == 3
    assert f"validation benchmark math500: 3 problems from {bench}, fewer than the 5 asked for" in caplog.text
