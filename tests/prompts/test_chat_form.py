"""Each data module's chat-message switch (arlopti.prompts.chat_form) is a setting that module accepts and
that gives its prompts chat messages (issue 45 §3: the turn loop's refusal named data.template=chat,
data.chat_template=true, and the K&K data module accepts neither)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlopti.prompts.chat_form import CHAT_FORM, chat_form_hint

REPO = Path(__file__).resolve().parents[2]


def _data_module(name: str, tok, tmp_path: Path, **setting):
    """The data module of configs/data/<name>.yaml, built small, with ``setting``; its train samples."""
    target = next(line.split(":", 1)[1].strip() for line in (REPO / "configs" / "data" / f"{name}.yaml").read_text()
                  .splitlines() if line.startswith("_target_:"))
    common = dict(tokenizer=tok, prompts_per_step=1, max_prompt_length=4096)
    if target.endswith("KKDataModule"):
        from arlopti.data.kk_datamodule import KKDataModule

        dm = KKDataModule(source="generated", train_people=[3], train_count_per_n=2, val_people=[3],
                          val_count_per_n=1, **common, **setting)
    elif target.endswith("MathDataModule"):
        from arlopti.data.math_datamodule import MathDataModule

        path = tmp_path / "train.jsonl"
        path.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
        dm = MathDataModule(train_file=str(path), **common, **setting)
    else:
        from arlopti.data.generic_datamodule import GenericPromptDataModule

        path = tmp_path / "rows.jsonl"
        path.write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
        dm = GenericPromptDataModule(train_file=str(path), **common, **setting)
    dm.setup()
    return dm.train_samples


@pytest.mark.parametrize("names, key, value", CHAT_FORM)
def test_each_data_modules_switch_gives_chat_messages(names, key, value, tiny_tokenizer, tmp_path):
    raw = {"template": {"qwen-instruct": "base", "chat": "raw"}.get(value), "chat_template": False}[key]
    on = _data_module(names[0], tiny_tokenizer, tmp_path, **{key: value == "true" if key == "chat_template" else value})
    off = _data_module(names[0], tiny_tokenizer, tmp_path, **{key: raw})
    assert on[0].messages and on[0].messages[-1]["role"] == "user"  # what an environment's first message joins
    assert off[0].messages is None  # raw text: the turn loop's refusal


def test_every_data_config_is_named_once_and_the_hint_names_each_switch():
    named = [n for names, _, _ in CHAT_FORM for n in names]
    assert sorted(named) == sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml"))
    assert chat_form_hint() == ("data=kk / kk_generated: data.template=qwen-instruct; data=deepscaler / dsr_uniform / "
                                "orz: data.template=chat; data=prompts / verl_parquet: data.chat_template=true")


def test_the_kk_data_module_refuses_the_old_hint(tiny_tokenizer, tmp_path):
    """What the old hint said, on K&K data: neither setting is accepted."""
    with pytest.raises(ValueError, match="data.template='chat': known templates are"):
        _data_module("kk", tiny_tokenizer, tmp_path, template="chat")
    with pytest.raises(TypeError, match="chat_template"):
        _data_module("kk", tiny_tokenizer, tmp_path, chat_template=True)
