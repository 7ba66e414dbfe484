"""TRL's environment contract, unchanged: TRL's documented IncrementEnv runs as written there, its tool called
from the model's <tool_call> blocks, its get_reward() the episode's environment reward."""

from __future__ import annotations

import json
import random
import re

import pytest

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.chat_encoding import ChatEncoding
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env import EnvError
from arlopti.tasks.env.loading import register_env
from helpers.turns import TOOL_TEMPLATE, IncrementEnv, ScriptedEngine, turn_number

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)


@pytest.fixture(scope="module")
def tool_tok():
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    return tok


def call(name: str, **args) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def solver(tok, ctx, seed):
    """Turn 0 increments by the target (or, for half the seeds, by one more); turn 1 answers."""
    text = tok.decode(ctx, skip_special_tokens=False)
    if turn_number(tok, ctx) > 0:
        return "done", False
    target = int(re.findall(r"Increment the counter by (\d+)\.", text)[-1])
    return call("increment", step=target + (random.Random(seed).random() < 0.5)), False


def run(tok, say, prompts=2, group=4, env=IncrementEnv, frac=0.5, tokens=256):
    recs = [PromptRecord(uid=f"p/{i}", ground_truth=None, task="toy", messages=[{"role": "user", "content": f"Go {i}. "}])
            for i in range(prompts)]
    batch = collate_prompts(tokenize_records(recs, tok, 1024, "test")[0])
    loop = build_turn_loop(RolloutConfig(max_turns=3, max_new_tokens=tokens, max_reply_tokens=512),
                           EnvConfig(env=register_env(env), max_error_frac=frac), tok)
    engine = ScriptedEngine(tok, say)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=tokens, seed=11, logprobs=True)
    return collect_groups(engine.generate, batch.prompt_ids, group, sampling, turns=loop, batch=batch), batch


def test_trls_documented_environment_runs_as_written(tool_tok):
    tok = tool_tok
    groups, batch = run(tok, solver)
    enc = ChatEncoding(tok)
    rewards = set()
    for i, group in enumerate(groups):
        prompt = tok.decode(group[0].prompt_ids, skip_special_tokens=False)
        # the tool schema (transformers' get_json_schema of the public method) and reset's message, appended
        # to the last user message as TRL appends it
        assert '"name": "increment"' in prompt and '"description": "Value to add to the counter."' in prompt
        target = int(re.search(rf"Go {i}\. Increment the counter by (\d+)\.<\|im_end\|>", prompt).group(1))
        assert all(e.prompt_ids == group[0].prompt_ids for e in group)  # one start state per group (seeded random)
        for e in group:
            step = int(re.search(r'"step": (\d+)', e.meta["transcript"]).group(1))
            reply = enc.reply_ids([{"role": "tool", "name": "increment", "content": str(step)}])
            n0 = e.trainable.index(0)
            assert e.token_ids[n0:n0 + len(reply)] == reply and e.trainable[n0:n0 + len(reply)] == [0] * len(reply)
            assert e.meta["env_reward"] == float(step == target) and e.meta["tool_calls"] == 1
            assert e.text == "done" and e.meta["turns"] == 2
            rewards.add(e.meta["env_reward"])
    assert rewards == {0.0, 1.0}
    assert len({tok.decode(g[0].prompt_ids) for g in groups}) == 2


def test_bad_tool_calls_get_error_replies(tool_tok):
    tok = tool_tok

    def say(tok, ctx, seed):
        return {0: call("decrement", step=1) + "<tool_call>{not json</tool_call>" + call("increment", stride=2),
                1: call("increment", step=3)}.get(turn_number(tok, ctx), "done"), False

    (group,), _ = run(tok, say, prompts=1, group=1, frac=1.0)
    e = group[0]
    text = tok.decode(e.token_ids, skip_special_tokens=False)
    assert "error: ToolCallError: there is no tool 'decrement' (tools: increment)" in text
    assert "error: ToolCallError: the tool call is not valid JSON" in text
    assert "error: ToolCallError: increment(step): missing a required argument: 'step'" in text
    assert "<tool_response>\n3\n</tool_response>" in text
    assert e.meta["tool_calls"] == 4 and e.meta["tool_errors"] == 3 and e.meta["turns"] == 3
    # calls naming no tool (decrement) or unparsable count as "unknown"; increment failed on 1 of its 2 calls
    with pytest.raises(EnvError, match=r"IncrementEnv: unknown failed on 2 of its 2 calls .*\(every call: unknown 2 "
                                       r"of 2, increment 1 of 2, get_reward 0 of 1, reset 0 of 1\)"):
        run(tok, say, prompts=1, group=1, frac=0.5)


class TwoTools:
    """A busy healthy tool beside one that always fails."""

    def reset(self, **kwargs) -> str | None:
        return None

    def echo(self, text: str) -> str:
        """
        Echo the text.

        Args:
            text: What to echo.
        """
        return text

    def lookup(self, key: str) -> str:
        """
        Look a key up.

        Args:
            key: The key.
        """
        raise KeyError(key)


def test_a_tool_failing_every_time_beside_a_busy_healthy_one_stops_the_run_naming_it(tool_tok):
    def say(tok, ctx, seed):  # turn 0: five echoes and one lookup (1 failure in 6 calls: under 0.5 pooled)
        return ("".join(call("echo", text=str(i)) for i in range(5)) + call("lookup", key="k")
                if turn_number(tok, ctx) == 0 else "done"), False

    with pytest.raises(EnvError, match=r"TwoTools: lookup failed on 4 of its 4 calls over the last 1 rollout "
                                       r"round\(s\), more than task.max_error_frac=0.5 \(every call: lookup 4 of 4, "
                                       r"echo 0 of 20, reset 0 of 4\).*First error of lookup: KeyError: 'k'"):
        run(tool_tok, say, prompts=1, group=4, env=TwoTools, tokens=512)
