"""The official prompt and its templates."""

import pytest

from arlopti.tasks.math.prompts import SUFFIX, build_prompt, strip_suffix


def test_suffix_is_official():
    assert SUFFIX == " Let's think step by step and output the final answer within \\boxed{}."


def test_templates():
    assert build_prompt("What is 1+1?") == {"text": "What is 1+1?" + SUFFIX}
    assert build_prompt("What is 1+1?", "chat") == {
        "messages": [{"role": "user", "content": "What is 1+1?" + SUFFIX}]}
    with pytest.raises(ValueError, match="raw.*chat"):
        build_prompt("x", "qwen")


def test_strip_suffix():
    assert strip_suffix("Find x." + SUFFIX) == "Find x."
    assert strip_suffix("Find x." + SUFFIX + "\n") == "Find x."
    assert strip_suffix("Find x.") == "Find x."
