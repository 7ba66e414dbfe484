"""MathDataModule: the DSR fixture, templates, length filtering, resumable order, bad input."""

import json
import os
from pathlib import Path

import pytest

from arlopti.data.math_datamodule import MathDataModule
from arlopti.tasks.math.prompts import SUFFIX

try:
    from conftest import need_fixture
except ImportError:  # tests/ is not on sys.path under --import-mode=importlib
    def need_fixture(rel: str) -> Path:
        shared = Path(os.environ.get("ARLOPTI_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
        path = shared / "fixtures" / rel
        if not path.exists():
            pytest.skip(f"shared fixture {path} is absent "
                        "(set ARLOPTI_SHARED to the folder holding fixtures/)")
        return path


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _small_set(tmp_path: Path, n: int = 24) -> Path:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]
    rows[1]["answer"] = 7.0
    rows[2]["answer"] = ["4", "four"]
    return _write_jsonl(tmp_path / "train.jsonl", rows)


def test_dsr_fixture_loads(tiny_tokenizer):
    path = need_fixture("math/dsr_uniform_train_10k.jsonl.gz")
    dm = MathDataModule(tokenizer=tiny_tokenizer, prompts_per_step=8, max_prompt_length=4096,
                        train_file=path, dataset_name="dsr_uniform", limit=64,
                        val_benchmarks=["aime24", "amc83"], val_limit=5)
    dm.setup()
    assert len(dm.train_samples) == 64
    s = dm.train_samples[0]
    assert s.uid == "math/dsr_uniform/0" and s.task == "math"
    assert s.prompt_text.endswith(SUFFIX) and SUFFIX not in s.prompt_text[: -len(SUFFIX)]
    assert s.meta["dataset"] == "dsr_uniform" and s.meta["split"] == "train"
    assert 0.0 <= s.meta["difficulty"] <= 100.0
    assert isinstance(s.ground_truth, str)
    assert sorted(dm.val_sets) == ["aime24", "amc83"]
    assert [v.uid for v in dm.val_sets["amc83"]] == [f"math/amc83/{i}" for i in range(5)]
    assert isinstance(dm.val_sets["amc83"][0].ground_truth, float)  # AMC golds are floats
    assert dm.val_sets["aime24"][0].meta == {"dataset": "aime24", "split": "test"}


def test_raw_and_chat_templates(tiny_tokenizer, tmp_path):
    path = _small_set(tmp_path)
    raw = MathDataModule(tokenizer=tiny_tokenizer, train_file=path)
    chat = MathDataModule(tokenizer=tiny_tokenizer, train_file=path, template="chat")
    raw.setup()
    chat.setup()
    assert raw.train_samples[0].prompt_text == "What is 0 + 0?" + SUFFIX
    assert chat.train_samples[0].prompt_text.startswith("<|im_start|>user\nWhat is 0 + 0?" + SUFFIX)
    # .../<folder>/train.jsonl names the dataset after its folder, as in data/prepared/<name>/.
    assert raw.train_samples[0].uid == f"math/{tmp_path.name}/0"
    assert [s.ground_truth for s in raw.train_samples[:3]] == ["0", 7.0, ["4", "four"]]
    with pytest.raises(ValueError, match="raw.*chat"):
        MathDataModule(train_file=path, template="qwen")


def test_length_filter_drops_long_prompts(tiny_tokenizer, tmp_path):
    rows = [{"problem": "x " * (5 if i % 2 else 400), "answer": "1"} for i in range(20)]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    dm = MathDataModule(tokenizer=tiny_tokenizer, train_file=path, max_prompt_length=120, prompts_per_step=2)
    dm.setup()
    assert dm.filtered_counts["train"] == 10
    assert all(len(s.prompt_ids) <= 120 for s in dm.train_samples)
    assert {s.uid for s in dm.train_samples} == {f"math/mixed/{i}" for i in range(1, 20, 2)}


def test_resume_continues_with_the_next_batch(tiny_tokenizer, tmp_path):
    path = _small_set(tmp_path)

    def make():
        dm = MathDataModule(tokenizer=tiny_tokenizer, train_file=path, prompts_per_step=4, seed=3)
        dm.setup()
        return dm

    first = make()
    batches = iter(first.train_dataloader())
    b0 = next(batches)
    first.mark_consumed(b0)
    b1 = next(batches)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert next(iter(resumed.train_dataloader())).uids == b1.uids
    assert b0.uids != b1.uids and b0.tasks == ["math"] * 4


def test_missing_file_names_path_and_prepare_command(tiny_tokenizer, tmp_path):
    missing = tmp_path / "data" / "prepared" / "orz" / "train.jsonl"
    dm = MathDataModule(tokenizer=tiny_tokenizer, train_file=missing)
    with pytest.raises(FileNotFoundError, match=r"(?s)orz/train.jsonl.*python -m arlopti.data.prepare orz"):
        dm.setup()


@pytest.mark.parametrize("bad", [{"value": 3}, None, [["1"]], True])
def test_unknown_answer_type_names_file_and_record(tiny_tokenizer, tmp_path, bad):
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": 2}, {"problem": "c", "answer": bad}]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    dm = MathDataModule(tokenizer=tiny_tokenizer, train_file=path)
    with pytest.raises(ValueError, match=r"bad.jsonl: record 2: the answer has an unsupported type"):
        dm.setup()


def test_unknown_benchmark_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="aime25"):
        MathDataModule(train_file=_small_set(tmp_path), val_benchmarks=["aime25"])
