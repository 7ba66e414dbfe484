"""K&K prompt templates."""

from __future__ import annotations

import pytest

from arlopti.tasks.kk.generator import sample_puzzles
from arlopti.tasks.kk.prompts import SYSTEM_PROMPT, TEMPLATES, build_prompt

PUZZLE = sample_puzzles(3, 1, seed=0)[0]


def test_qwen_instruct_uses_the_chat_template(tiny_tokenizer):
    pieces = build_prompt(PUZZLE, "qwen-instruct")
    assert pieces.text is None and pieces.assistant_prefix == "<think>"
    assert [m["role"] for m in pieces.messages] == ["system", "user"]
    assert pieces.messages[1]["content"] == PUZZLE.quiz
    for needle in ("<think> </think>", "<answer> </answer>", "(1) Zoey is a knight\n(2)"):
        assert needle in SYSTEM_PROMPT
    assert "<|im_start|>" not in SYSTEM_PROMPT  # never hard-code a model's special tokens
    rendered = build_prompt(PUZZLE, "qwen-instruct", tokenizer=tiny_tokenizer).rendered
    expected = tiny_tokenizer.apply_chat_template(list(pieces.messages), tokenize=False,
                                                  add_generation_prompt=True) + "<think>"
    assert rendered == expected and rendered.endswith("<think>")


def test_base_template_is_plain_text(tiny_tokenizer):
    pieces = build_prompt(PUZZLE, "base")
    assert pieces.messages is None and pieces.assistant_prefix == ""
    assert pieces.text == f"{SYSTEM_PROMPT}\n\nUser: {PUZZLE.quiz}\nAssistant: <think>"
    assert build_prompt(PUZZLE, "base", tokenizer=tiny_tokenizer).rendered == pieces.text


def test_prompt_record(tiny_tokenizer):
    rec = build_prompt(PUZZLE, "qwen-instruct").to_prompt_record(
        uid="kk/x/1", ground_truth=PUZZLE.solution_text_format, meta={"n_people": 3})
    assert rec.task == "kk" and rec.assistant_prefix == "<think>" and rec.meta == {"n_people": 3}
    assert rec.messages[0]["role"] == "system"


def test_unknown_template_lists_known_ones():
    with pytest.raises(ValueError) as err:
        build_prompt(PUZZLE, "chatml")
    for name in TEMPLATES:
        assert name in str(err.value)


def test_chat_template_needs_a_tokenizer_chat_template(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        build_prompt(PUZZLE, "qwen-instruct", tokenizer=tok)


def official_puzzle():
    import json

    from conftest import need_fixture

    from arlopti.tasks.kk.puzzle import Puzzle

    record = json.loads(need_fixture("kk/kk_test_3ppl.jsonl").read_text().splitlines()[0])
    return record, Puzzle.from_record(record)


def test_official_template_feeds_the_record_prompt_verbatim(tiny_tokenizer):
    from arlopti.prompts.records import render_prompt

    record, puzzle = official_puzzle()
    pieces = build_prompt(puzzle, "official")
    assert pieces.text == record["prompt"] and pieces.messages is None and pieces.assistant_prefix == ""
    assert build_prompt(puzzle, "official", tokenizer=tiny_tokenizer).rendered == record["prompt"]
    rec = pieces.to_prompt_record(uid="kk/x", ground_truth=puzzle.solution_text_format)
    assert render_prompt(rec, tiny_tokenizer) == record["prompt"]  # no chat template applied


def test_official_template_without_a_prompt_is_a_clear_error():
    import dataclasses

    with pytest.raises(ValueError) as err:
        build_prompt(PUZZLE, "official")  # our generator's puzzles carry no official prompt
    assert "'prompt'" in str(err.value) and "qwen-instruct" in str(err.value)
    _, puzzle = official_puzzle()
    with pytest.raises(ValueError, match="does not end in '<think>'"):
        build_prompt(dataclasses.replace(puzzle, prompt=puzzle.prompt + "\n"), "official")
