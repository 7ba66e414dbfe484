"""Issue 52 row 3: what an environment returns is checked. ``done`` must be a bool (or the int 0 or 1), a reward a
finite float (or None from ``step``); anything else stops the run with one line naming the environment's class,
the call and the value. Run through the turn loop with the environment in worker processes, as training runs it."""

from __future__ import annotations

import pytest

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env import EnvError
from arlopti.tasks.env.loading import register_env
from helpers.env_edges import RewardReturns, StepReturns
from helpers.turns import TOOL_TEMPLATE, ScriptedEngine

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5, logprobs=True)


def play(tok, env, case: str):
    """One prompt, one episode of ``env`` with the row's ``case``; the model says ``done`` every turn."""
    loop = build_turn_loop(RolloutConfig(max_turns=3, max_new_tokens=16),
                           EnvConfig(env=register_env(env), env_timeout_s=60.0, max_error_frac=1.0), tok)
    recs = [PromptRecord(uid="p/0", ground_truth=None, task="toy", meta={"case": case},
                         messages=[{"role": "user", "content": "Go"}])]
    batch = collate_prompts(tokenize_records(recs, tok, 1024, "test")[0])
    engine = ScriptedEngine(tok, lambda tok, ctx, seed: ("done", False))
    try:
        return collect_groups(engine.generate, batch.prompt_ids, 1, SAMPLING, turns=loop, batch=batch)[0][0]
    finally:
        loop.close()


@pytest.mark.parametrize("case, shown", [("done_no", "done='no' (a str)"), ("done_two", "done=2 (an int)"),
                                         ("done_half", "done=0.5 (a float)"), ("done_none", "done=None (a NoneType)")])
def test_a_done_that_is_not_a_bool_stops_the_run_naming_the_value(tiny_tokenizer, case, shown):
    with pytest.raises(EnvError) as err:
        play(tiny_tokenizer, StepReturns, case)
    line = str(err.value)
    assert "\n" not in line and line.startswith("the environment StepReturns: step returned ")
    assert shown in line and "done must be a bool (True or False; the ints 0 and 1 are read as such)" in line


@pytest.mark.parametrize("case, shown", [("reward_huge", "the reward 1000000000"),
                                         ("reward_nan", "a non-finite reward nan"),
                                         ("reward_inf", "a non-finite reward -inf")])
def test_a_step_reward_that_is_not_a_finite_float_stops_the_run_naming_the_value(tiny_tokenizer, case, shown):
    with pytest.raises(EnvError) as err:  # 10**400 used to end the run with a bare OverflowError
        play(tiny_tokenizer, StepReturns, case)
    line = str(err.value)
    assert "\n" not in line and line.startswith("the environment StepReturns: step returned ")
    assert shown in line and "a reward must be a finite float" in line and len(line) < 600


def test_a_step_reward_of_another_type_breaks_the_step_contract_and_shows_the_value(tiny_tokenizer):
    with pytest.raises(EnvError) as err:
        play(tiny_tokenizer, StepReturns, "reward_str")
    assert str(err.value) == ("the environment StepReturns: step must return (reply: str | None, done: bool, reward: "
                              "float | None) or (reply, done), and returned ('a', True, '1.0')")


def test_done_as_0_or_1_and_an_int_reward_are_read_as_such(tiny_tokenizer):
    ended = play(tiny_tokenizer, StepReturns, "ints")
    assert ended.meta["turns"] == 1 and ended.meta["env_reward"] == 2.0 and type(ended.meta["env_reward"]) is float
    went_on = play(tiny_tokenizer, StepReturns, "zero")
    assert went_on.meta["turns"] == 2  # done=0: the episode went on to its second step, which ended it


@pytest.mark.parametrize("case, shown", [("huge", "the reward 1000000000"), ("str", "the reward '0.5' (a str)"),
                                         ("none", "the reward None (a NoneType)")])
def test_a_get_reward_that_is_not_a_finite_float_stops_the_run_naming_the_value(case, shown):
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    with pytest.raises(EnvError) as err:
        play(tok, RewardReturns, case)
    line = str(err.value)
    assert "\n" not in line and line.startswith("the environment RewardReturns: get_reward returned ")
    assert shown in line and "on prompt p/0" in line and "a reward must be a finite float" in line


def test_the_checks_themselves():
    from arlopti.tasks.env.base import check_done, check_reward

    assert check_done("E", True) is True and check_done("E", 0) is False and check_done("E", 1) is True
    assert check_reward("E", "step", None) is None and check_reward("E", "step", 3) == 3.0
    with pytest.raises(EnvError, match=r"the environment E: step returned done='True' \(a str\)"):
        check_done("E", "True")
    with pytest.raises(EnvError, match=r"the reward 1000000000\d*\.\.\. \(an int, \d+ digits\)"):
        check_reward("E", "step", 10**5000)  # too long even to print whole (Python refuses > 4300 digits)
