"""``data=prompts`` (arlopti/data/generic_datamodule.py): every source format, column mapping, the
length filter's count, the validation split, and errors that name the file, line and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlopti.data.generic_datamodule import GenericPromptDataModule, _dataset_name, split_indices

ROWS = [{"prompt": f"Question {i}?", "answer": str(i), "level": i % 2} for i in range(5)]


def write(tmp_path: Path, kind: str, rows=ROWS) -> str:
    """``rows`` as a ``kind`` source under tmp_path; returns the spec for data.train_file."""
    if kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = tmp_path / "t.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "t.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "csv":
        import csv

        path = tmp_path / "t.csv"
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif kind == "datasets":
        from datasets import Dataset

        path = tmp_path / "ds"
        Dataset.from_list(rows).save_to_disk(str(path))
    elif kind == "datasets_split":
        from datasets import Dataset, DatasetDict

        path = tmp_path / "dsd"
        DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(str(path))
        return f"{path}@train"
    else:
        raise AssertionError(kind)
    return str(path)


def build(tok, **kwargs) -> GenericPromptDataModule:
    kwargs.setdefault("chat_template", False)
    dm = GenericPromptDataModule(tokenizer=tok, prompts_per_step=1, max_prompt_length=512, **kwargs)
    dm.setup()
    return dm


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "datasets", "datasets_split"])
def test_every_source_format_reads_the_same_prompts(kind, tmp_path, tiny_tokenizer):
    dm = build(tiny_tokenizer, train_file=write(tmp_path, kind))
    assert [s.prompt_text for s in dm.train_samples] == [r["prompt"] for r in ROWS]
    assert [s.ground_truth for s in dm.train_samples] == [r["answer"] for r in ROWS]
    level = dm.train_samples[1].meta["level"]
    assert level == ("1" if kind == "csv" else 1)  # CSV values are strings
    assert dm.train_samples[1].meta["split"] == "train" and dm.train_samples[1].meta["index"] == 1
    assert dm.train_samples[0].task == "custom"


def test_datasetdict_folder_without_split_lists_the_splits(tmp_path):
    spec = write(tmp_path, "datasets_split").split("@")[0]
    dm = GenericPromptDataModule(train_file=spec)
    with pytest.raises(ValueError, match=r"holds the splits \['train', 'test'\]: name one as .*@<split>"):
        dm.train_records()


def test_hub_source_calls_load_dataset_with_name_config_and_split(monkeypatch):
    import datasets

    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        return [{"question": "q?", "answer": "1"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    dm = GenericPromptDataModule(train_file="hub:openai/gsm8k:main", val_file="hub:openai/gsm8k:main@test",
                                 prompt_key="question")
    assert dm.dataset_name == "gsm8k"
    assert dm.train_records()[0].uid == "custom/gsm8k/train/0"
    dm.val_records()
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]


def test_column_mapping_chat_and_raw(tmp_path, tiny_tokenizer):
    rows = [{"question": "What is 1 + 1?", "solution": 2, "source": "s1"}]
    spec = write(tmp_path, "jsonl", rows)
    raw = build(tiny_tokenizer, train_file=spec, prompt_key="question", answer_key="solution",
                system_prompt="Be brief.", assistant_prefix="<think>")
    s = raw.train_samples[0]
    assert s.prompt_text == "Be brief.\n\nWhat is 1 + 1?<think>"
    assert s.ground_truth == 2 and s.meta == {"source": "s1", "dataset": "t", "split": "train", "index": 0}
    assert s.uid == "custom/t/train/0"
    chat = build(tiny_tokenizer, train_file=spec, prompt_key="question", answer_key=None, system_prompt="Be brief.",
                 chat_template=True, task="math")
    s = chat.train_samples[0]
    assert s.prompt_text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n"
                             "<|im_start|>assistant\n")
    assert s.ground_truth is None and s.task == "math" and "solution" in s.meta


def test_messages_column(tmp_path, tiny_tokenizer):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    spec = write(tmp_path, "jsonl", [{"messages": msgs, "answer": "x"}])
    dm = build(tiny_tokenizer, train_file=spec, prompt_key="messages", chat_template=True, system_prompt="ignored")
    assert dm.train_samples[0].prompt_text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                               "<|im_start|>assistant\n")  # the record's own system message kept
    with pytest.raises(ValueError, match=r"t\.jsonl:1: column 'messages' holds chat messages, which need "
                                         r"data\.chat_template=true"):
        build(tiny_tokenizer, train_file=spec, prompt_key="messages")


def test_missing_column_names_it_and_lists_the_present_ones(tmp_path):
    rows = [dict(ROWS[0]), {"question": "q", "answer": "1"}]
    spec = write(tmp_path, "jsonl", rows)
    with pytest.raises(ValueError, match=r"t\.jsonl:2: no column 'prompt' \(data\.prompt_key\); the record's "
                                         r"columns: \['answer', 'question'\]"):
        GenericPromptDataModule(train_file=spec).train_records()
    with pytest.raises(ValueError, match=r"t\.jsonl:1: no column 'label' \(data\.answer_key; null for none\)"):
        GenericPromptDataModule(train_file=spec, answer_key="label").train_records()
    bad = write(tmp_path, "jsonl", [{"prompt": 3, "answer": "1"}])
    with pytest.raises(ValueError, match=r"t\.jsonl:1: column 'prompt' \(data\.prompt_key\) holds a int"):
        GenericPromptDataModule(train_file=bad).train_records()


def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:3: not valid JSON"):
        GenericPromptDataModule(train_file=str(path)).train_records()
    path = tmp_path / "t.csv"
    path.write_text("prompt,answer\nq1,1\nq2,2,extra\n")
    with pytest.raises(ValueError, match=r"t\.csv:3: 3 fields, but the header \(.*t\.csv:1\) has 2"):
        GenericPromptDataModule(train_file=str(path)).train_records()
    with pytest.raises(FileNotFoundError, match=r"data\.train_file=.*nope\.jsonl: no such file or folder"):
        GenericPromptDataModule(train_file=str(tmp_path / "nope.jsonl")).train_records()


def test_length_filter_drops_and_counts_never_truncates(tmp_path, tiny_tokenizer):
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "long " * 200, "answer": "2"},
            {"prompt": "also short", "answer": "3"}]
    limit = len(tiny_tokenizer("long " * 200, add_special_tokens=False)["input_ids"]) - 1
    dm = GenericPromptDataModule(tokenizer=tiny_tokenizer, prompts_per_step=1, max_prompt_length=limit,
                                 train_file=write(tmp_path, "jsonl", rows), chat_template=False)
    dm.setup()
    assert dm.filtered_counts == {"train": 1}
    assert [s.ground_truth for s in dm.train_samples] == ["1", "3"]
    for s in dm.train_samples:  # kept whole
        assert s.prompt_ids == tiny_tokenizer(s.prompt_text, add_special_tokens=False)["input_ids"]


def test_val_fraction_split_is_seeded_and_disjoint(tmp_path, tiny_tokenizer):
    # numpy.random.default_rng(0).permutation(10) = [4 6 2 7 3 5 9 0 8 1]: 0.3 * 10 = 3 rows -> {4, 6, 2}
    assert split_indices(10, 0.3, 0) == ([0, 1, 3, 5, 7, 8, 9], [2, 4, 6])
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(10)]
    dm = build(tiny_tokenizer, train_file=write(tmp_path, "jsonl", rows), val_fraction=0.3, seed=123)
    assert [s.ground_truth for s in dm.val_sets["val"]] == ["2", "4", "6"]
    assert [s.ground_truth for s in dm.train_samples] == ["0", "1", "3", "5", "7", "8", "9"]
    assert dm.val_sets["val"][0].uid == "custom/t/val/2"
    with pytest.raises(ValueError, match="leaves no training row"):
        split_indices(2, 0.9, 0)
    with pytest.raises(ValueError, match="give one of them"):
        GenericPromptDataModule(train_file="a.jsonl", val_file="b.jsonl", val_fraction=0.1)
    with pytest.raises(ValueError, match=r"data\.val_fraction=1\.0: expected a number in \(0, 1\)"):
        GenericPromptDataModule(train_file="a.jsonl", val_fraction=1.0)


def test_dataset_name_from_source():
    assert _dataset_name("data/my_task/train.jsonl") == "my_task"
    assert _dataset_name("qa.csv") == "qa"
    assert _dataset_name("hub:openai/gsm8k:main@test") == "gsm8k"
    assert _dataset_name("folder/ds@train") == "ds"


def test_preview_writes_the_prompts_fed(tmp_path):
    from arlopti.data.preview import main

    spec = write(tmp_path, "jsonl")
    out = tmp_path / "fed.jsonl"
    assert main(["data=prompts", f"data.train_file={spec}", "data.val_fraction=0.4", "data.chat_template=false",
                 "--out", str(out)]) == 0
    fed = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["split"], r["set"]) for r in fed] == [("train", "train")] * 3 + [("val", "val")] * 2
    assert {r["prompt_text"] for r in fed} == {r["prompt"] for r in ROWS}


def _write_verl_parquet(path: Path) -> Path:
    """Rows in verl's RL layout (verl/utils/dataset/README.md), written with pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": f"What is {i} + {i}? Put the answer after ####."}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"split": "train", "index": i}} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_parquet_preset_reads_messages_and_nested_ground_truth(tmp_path, tiny_tokenizer):
    from arlopti.config.compose import compose

    path = _write_verl_parquet(tmp_path / "train.parquet")
    cfg = compose(["data=verl_parquet", f"data.train_file={path}"])
    assert cfg.data.answer_key == "reward_model.ground_truth"
    import hydra

    dm = hydra.utils.instantiate(cfg.data, tokenizer=tiny_tokenizer)
    records = dm.train_records()
    assert [r.ground_truth for r in records] == ["0", "2", "4", "6"]
    assert records[1].messages == [{"role": "user", "content": "What is 1 + 1? Put the answer after ####."}]
    assert records[1].meta["data_source"] == "openai/gsm8k" and records[1].meta["extra_info"]["index"] == 1
    assert records[1].meta["reward_model"]["style"] == "rule"


def test_dotted_key_errors_name_where_the_walk_stopped(tmp_path):
    path = _write_verl_parquet(tmp_path / "train.parquet")
    dm = GenericPromptDataModule(train_file=str(path), prompt_key="prompt", answer_key="reward_model.gold")
    with pytest.raises(ValueError, match=r"no column 'reward_model.gold' \(data.answer_key.*reward_model holds the "
                                         r"keys \['ground_truth', 'style'\]"):
        dm.train_records()
    dm = GenericPromptDataModule(train_file=str(path), prompt_key="question.text")
    with pytest.raises(ValueError, match=r"train.parquet\[0\]: no column 'question.text' \(data.prompt_key\); the "
                                         r"record's columns"):
        dm.train_records()
