"""The toy environment of the multi-turn learning test (arlopti/tasks/env/toy.py): its reward, its turns, and
an episode through the turn loop with the tiny model's own tokenizer."""

from __future__ import annotations

import pytest

from helpers.turns import ScriptedEngine

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env.base import is_text_env
from arlopti.tasks.env.toy import ToyWordsEnv, letter_share


def test_letter_share():
    assert letter_share("abcdefgh") == 1.0 and letter_share("nopqrstu") == 0.0
    assert letter_share("abcdefghIJK") == 1.0  # only the first 8 characters count
    assert letter_share("ab ") == 0.25 and letter_share("") == 0.0  # a short turn counts its missing characters as 0
    assert letter_share("ABC abc") == 3 / 8  # lower-case a-m only


def test_turns_and_rewards():
    env = ToyWordsEnv()
    assert is_text_env(ToyWordsEnv) and env.reset({"uid": "x"}) is None
    assert env.step("abcd ") == ("then ", False, 0.5)
    assert env.step("zz ") == ("then ", False, 0.0)
    assert env.step("abcdefgh ") == (None, True, None)  # the third turn is the final answer, scored by the task
    assert env.reset({}) is None and env.step("a ")[1] is False  # reset starts over


@pytest.mark.process


def test_an_episode_continues_the_message_after_each_stopped_turn(tiny_tokenizer):
    tok = tiny_tokenizer

    def say(tok, ctx, seed):  # turn k (k replies so far) says the k-th word, ended by the stop string
        return ["ab ", "cd ", "ef "][tok.decode(ctx).count("then ")], True

    batch = collate_prompts(tokenize_records([PromptRecord(uid="t/0", ground_truth=None, task="t", text="Zoey said 1.")],
                                             tok, 256, "test")[0])
    loop = build_turn_loop(RolloutConfig(max_turns=3, max_new_tokens=8, stop=[" "], max_episode_tokens=40),
                           EnvConfig(env="arlopti.tasks.env.toy:ToyWordsEnv"), tok)
    (group,) = collect_groups(ScriptedEngine(tok, say).generate,
                              batch.prompt_ids, 2, SamplingConfig(seed=0), turns=loop, batch=batch)
    for e in group:
        assert e.meta["turns"] == 3 and e.meta["env_reward"] == 0.25 + 0.25 and e.text == "ef "
        assert e.meta["transcript"].count("[[env]]then [[/env]]") == 2  # plain text, no chat header
        assert sum(e.trainable) == 9 and e.meta["env_tokens"] == len(e.token_ids) - 9
