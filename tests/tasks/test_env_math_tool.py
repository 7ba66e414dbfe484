"""Math with a Python tool (arlopti/tasks/env/math_tool.py): which code a turn runs, the replies of both
contracts, and whole episodes through the turn loop whose final answer the official math grader scores,
on DSR-Uniform and benchmark problems."""

from __future__ import annotations

import json

import pytest
from conftest import need_fixture
from helpers.turns import TOOL_TEMPLATE, ScriptedEngine, turn_number

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env.base import is_text_env
from arlopti.tasks.env.math_tool import (
    INSTRUCTION,
    MathPythonTool,
    MathToolEnv,
    code_blocks,
    output_reply,
    turn_code,
)
from arlopti.tasks.env.python_tool import PythonLimits
from arlopti.tasks.env.tools import tool_schemas
from arlopti.tasks.math import MathTask, build_prompt
from arlopti.tasks.math.readers import read_math_file

pytestmark = pytest.mark.timeout(120)
FENCE = "```"


def block(code: str, closed: bool = True) -> str:
    return f"{FENCE}python\n{code}\n" + (f"{FENCE}\n" if closed else "")


def test_which_code_a_turn_runs():
    assert turn_code("I will compute.\n" + block("x = 6") + "then\n" + block("print(x * 7)")) == "x = 6\n\nprint(x * 7)\n"
    assert turn_code(block("print(1)", closed=False)) == "print(1)\n"  # cut by a stop string or the token limit
    assert turn_code(f"{FENCE}py\nprint(2)\n{FENCE}") == "print(2)\n"
    assert turn_code(f"{FENCE}Python  \nprint(3)\n{FENCE}") == "print(3)\n"
    assert turn_code(block("print(4)") + "So the answer is \\boxed{4}.") is None  # answered after its code
    assert turn_code("The answer is \\boxed{4}, let me check:\n" + block("print(4)")) == "print(4)\n"
    assert turn_code("No code here, \\boxed{5}.") is None and turn_code("") is None
    assert turn_code(f"{FENCE}\nprint(5)\n{FENCE}") is None  # only python blocks run
    two = block("a") + block("b")
    assert [two[:end] for end, _ in code_blocks(two)] == [block("a").rstrip(), two.rstrip()]  # ends after each fence


def test_the_reply_opens_or_continues_the_output_block():
    assert output_reply(block("print(4)"), "4\n") == "```output\n4\n```\n"
    assert output_reply(block("print(4)") + "```output", "4") == "\n4\n```\n"  # ToRL: the model opened it
    assert output_reply(block("pass"), "") == "```output\n```\n"


@pytest.mark.process


def test_text_env_runs_the_code_and_ends_on_the_answer():
    env = MathToolEnv()
    assert is_text_env(MathToolEnv) and env.reset({"ground_truth": "42"}) == INSTRUCTION
    reply, done, reward = env.step("Let me compute.\n" + block("print(6 * 7)"))
    assert (reply, done, reward) == ("```output\n42\n```\n", False, None)
    reply, done, _ = env.step(block("print(1 / 0)"))
    assert not done and "ZeroDivisionError: division by zero" in reply  # the model's error is the reply
    assert env.step("So the answer is \\boxed{42}.") == (None, True, None)
    assert env.runs == ["ok", "error"]


@pytest.mark.process


def test_text_env_limits_are_a_class_attribute():
    class Quick(MathToolEnv):
        limits = PythonLimits(cpu_s=1, wall_s=1)

    env = Quick()
    env.reset({})
    reply, done, _ = env.step(block("while True:\n    pass"))
    assert not done and "TimeoutError: the code was stopped after 1 s" in reply and env.runs == ["timeout"]


@pytest.mark.process


def test_trl_tool_schema_and_calls():
    env = MathPythonTool()
    assert not is_text_env(MathPythonTool) and env.reset(prompt="x", ground_truth="1") is None
    (schema,) = tool_schemas(env)
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert schema["function"]["parameters"]["properties"]["code"]["type"] == "string"
    assert env.python("import math\nprint(math.comb(10, 3))") == "120\n"
    assert "NameError" in env.python("print(undefined_name)") and env.runs == ["ok", "error"]


def _problems(rel: str, n: int):
    return read_math_file(need_fixture(rel), limit=n)


def _batch(tok, problems, template="chat"):
    recs = [PromptRecord(uid=f"math/t/{i}", ground_truth=p.answer, task="math", **build_prompt(p.problem, template))
            for i, p in enumerate(problems)]
    return collate_prompts(tokenize_records(recs, tok, 100_000, "test")[0])


def _gold_in(tok, ctx, problems) -> str:
    """The gold answer of the problem in the context: what the scripted model 'knows' (test only)."""
    text = tok.decode(ctx, skip_special_tokens=False)
    (answer,) = [p.answer for p in problems if p.problem in text]
    return json.dumps(answer)


@pytest.mark.parametrize("rel", ["math/dsr_uniform_train_10k.jsonl.gz", "math/math500.jsonl", "math/aime2024.jsonl"])
@pytest.mark.process
def test_text_episode_on_real_problems_is_graded_by_the_official_grader(tiny_tokenizer, rel):
    tok = tiny_tokenizer
    problems = _problems(rel, 2)
    batch = _batch(tok, problems)

    def say(tok, ctx, seed):
        text = tok.decode(ctx, skip_special_tokens=True)
        if "```output\n" not in text:  # ToRL: the code, then the opened output fence (a stop string)
            return "I compute it.\n" + block(f"print({_gold_in(tok, ctx, problems)})") + "```output", True
        shown = text.rsplit("```output\n", 1)[1].split("\n```")[0]
        return f"So the answer is \\boxed{{{shown if seed % 2 else 'wrong'}}}.", False

    rollout = RolloutConfig(max_turns=3, max_new_tokens=4096, max_reply_tokens=512, stop=["```output"])
    loop = build_turn_loop(rollout, EnvConfig(env="arlopti.tasks.env.math_tool:MathToolEnv"), tok)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4096, seed=3)
    groups = collect_groups(ScriptedEngine(tok, say).generate, batch.prompt_ids, 4, sampling, turns=loop, batch=batch)
    task = MathTask()
    try:
        for p, group in zip(problems, groups):
            assert INSTRUCTION in tok.decode(group[0].prompt_ids)
            for e in group:
                # the answer turn is a step too (env_steps counts steps, tool_calls TRL tool calls only)
                assert e.meta["turns"] == 2 and e.meta["env_steps"] == 2 and e.meta["tool_calls"] == 0 and e.meta["tool_errors"] == 0
                env_text = e.meta["transcript"].split("[[env]]")[1].split("[[/env]]")[0]
                assert env_text.startswith("\n") and env_text.endswith("```\n")  # continues the opened block
                assert sum(e.trainable) < len(e.trainable)  # the output is environment text
            results = task.score([e.text for e in group], [p.answer] * len(group), [{}] * len(group))
            assert {r.reward for r in results} == {0.0, 1.0}
            assert all((r.reward == 1.0) == ("wrong" not in e.text) for r, e in zip(results, group))
    finally:
        task.close()


@pytest.mark.process


def test_trl_episode_calls_the_python_tool(tiny_tokenizer):
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    problems = _problems("math/amc2023_40.jsonl", 1)
    batch = _batch(tok, problems)
    code = "import sympy\nprint(sympy.Integer(2) ** 10)"

    def say(tok, ctx, seed):
        if turn_number(tok, ctx) == 0:
            return f'<tool_call>{json.dumps({"name": "python", "arguments": {"code": code}})}</tool_call>', False
        shown = tok.decode(ctx, skip_special_tokens=True).rsplit("<tool_response>\n", 1)[1].split("\n")[0]
        return f"\\boxed{{{shown}}}", False

    loop = build_turn_loop(RolloutConfig(max_turns=2, max_new_tokens=512, max_reply_tokens=512),
                           EnvConfig(env="arlopti.tasks.env.math_tool:MathPythonTool"), tok)
    groups = collect_groups(ScriptedEngine(tok, say).generate, batch.prompt_ids, 2, SamplingConfig(seed=1),
                            turns=loop, batch=batch)
    for e in groups[0]:
        assert '"name": "python"' in tok.decode(e.prompt_ids) and e.meta["tool_calls"] == 1
        assert e.text == "\\boxed{1024}" and e.meta["tool_errors"] == 0
