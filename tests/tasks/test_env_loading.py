"""task.env: finding the class, telling the contract, the tools' schema, the parsed tool calls."""

from __future__ import annotations

import textwrap

import pytest

from arlopti.config import ConfigError
from arlopti.tasks.env import EnvError, TextEnv, is_text_env
from arlopti.tasks.env.loading import env_config, load_env, register_env
from arlopti.tasks.env.tools import ToolCall, call_tool, parse_hermes, tool_methods, tool_schemas
from helpers.turns import CountEnv, IncrementEnv


def test_a_class_is_found_by_file_path_by_module_and_in_process(tmp_path, monkeypatch):
    (tmp_path / "my_env.py").write_text(textwrap.dedent('''
        class Guess:
            turn_prefix = "<think>"
            def reset(self, row):
                return None
            def step(self, text):
                return None, True, 1.0
    '''))
    monkeypatch.chdir(tmp_path)
    by_file = load_env("my_env.py:Guess")
    assert by_file.text and by_file.tools == [] and by_file.turn_prefix == "<think>" and by_file.name == "Guess"
    assert load_env("my_env:Guess").text
    spec = load_env(register_env(IncrementEnv))
    assert not spec.text and [t["function"]["name"] for t in spec.tools] == ["increment"]
    with pytest.raises(ConfigError, match=r"task.env=my_env.py:Nope: .*has no attribute 'Nope'"):
        load_env("my_env.py:Nope")
    with pytest.raises(ConfigError, match=r"task.env=nowhere.py:X: .*does not exist"):
        load_env("nowhere.py:X")


def test_the_contract_is_told_by_the_step_signature():
    class Game:  # TRL: a tool named step is still a tool when its parameter is not `text`
        def reset(self, **row):
            return None

        def step(self, action: str) -> str:
            """Move.

            Args:
                action: up or down.
            """
            return action

    assert is_text_env(CountEnv) and not is_text_env(Game) and not is_text_env(IncrementEnv)
    assert issubclass(CountEnv, TextEnv)
    assert [t["function"]["name"] for t in tool_schemas(Game())] == ["step"]


def test_a_tool_needs_type_hints_and_a_docstring():
    class Undocumented:
        def reset(self, **row):
            return None

        def look(self, where):
            return where

    with pytest.raises(EnvError, match=r"the tool Undocumented.look has no usable schema"):
        load_env(register_env(Undocumented))

    class Nothing:
        def reset(self, **row):
            return None

    with pytest.raises(EnvError, match="no public method to call as a tool"):
        load_env(register_env(Nothing))


def test_the_schema_is_transformers_own():
    from transformers.utils import get_json_schema

    env = IncrementEnv()
    assert tool_schemas(env) == [get_json_schema(env.increment)]
    assert sorted(tool_methods(env)) == ["increment"]  # reset and get_reward are not tools


def test_hermes_tool_calls_are_parsed_in_order():
    text = ('think <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> then '
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call><tool_call>[1]</tool_call>')
    calls = parse_hermes(text)
    assert calls[:2] == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]
    assert calls[2].error and parse_hermes("no call here") == []
    assert call_tool({"a": lambda x: x + 1}, calls[0]) == "2"


def test_the_task_node_gives_the_environment_settings():
    env = env_config({"env": "e.py:E", "env_timeout_s": 3, "max_error_frac": 0.1, "reward_fn": "r.py:f"})
    assert env.env == "e.py:E" and env.env_timeout_s == 3 and env.max_error_frac == 0.1
    with pytest.raises(ConfigError, match="task.env_timeout_s"):
        env_config({"env_timeout_s": 0})
    with pytest.raises(ConfigError, match="task.tool_format"):
        env_config({"tool_format": "xml"})


def test_train_yaml_holds_the_schema_defaults_of_the_task_node():
    import dataclasses

    from omegaconf import OmegaConf

    from arlopti.config.compose import compose
    from arlopti.config.schema import EnvConfig

    cfg = compose([])
    assert OmegaConf.to_container(cfg.task) == dataclasses.asdict(EnvConfig())
    assert cfg.tasks.custom is None  # without task=custom the node is only the environment's
    custom = compose(["task=custom", "task.reward_fn=r.py:f", "task.env=e.py:E"])
    assert custom.task.env == "e.py:E" and "env" not in custom.tasks.custom and custom.tasks.custom.reward_fn == "r.py:f"


def test_arlopti_run_hands_a_class_over_as_task_env():
    from arlopti.entry.api import build_overrides

    (override,) = build_overrides([], env=CountEnv)
    spec = override.split("=", 1)[1].strip("'")
    assert override.startswith("task.env='callable:") and load_env(spec).factory is CountEnv
    assert build_overrides(["rollout.max_turns=3"], env="my_env.py:Guess") == ["rollout.max_turns=3",
                                                                              "task.env='my_env.py:Guess'"]
