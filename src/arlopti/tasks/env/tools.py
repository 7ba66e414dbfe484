"""A TRL-contract environment's tools: which methods they are, their JSON schema, the model's calls.

* :func:`tool_methods`: the public bound methods of an environment instance, minus the reserved
  ``reset`` / ``get_reward`` / ``close`` (TRL's rule: ``inspect.getmembers(env, inspect.ismethod)``
  without ``_``-names, read in ``GRPOTrainer.__init__``);
* :func:`tool_schemas`: their JSON schema from type hints and Google-style docstrings, by
  transformers' own ``get_json_schema`` (what ``apply_chat_template(tools=...)`` would build from
  the same functions); a method it cannot describe is an :class:`~arlopti.tasks.env.base.EnvError`
  naming it;
* :func:`parse_tool_calls`: the tool calls of a model turn in a chat-template format
  (:data:`TOOL_CALL_FORMATS`; ``hermes``, Qwen2.5 / Qwen3 / Hermes:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn allowed);
* :func:`call_tool`: one call's result as the content of a ``tool`` message (``str(result)``, as TRL
  does); a call that cannot be made (unknown tool, malformed JSON, arguments that do not fit) raises
  :class:`ToolCallError`, which the turn loop turns into an error reply.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from arlopti.tasks.env.base import RESERVED_METHODS, EnvError


class ToolCallError(ValueError):
    """A tool call the environment cannot run (unknown name, malformed call, bad arguments)."""


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model turn: the tool's ``name`` and its ``arguments``, or, for a call
    that could not be parsed, ``error`` (what was wrong)."""

    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None


def tool_methods(env) -> dict[str, Callable]:
    """``{name: bound method}`` of ``env``'s tools (module docstring), in name order."""
    return {name: member for name, member in inspect.getmembers(env, predicate=inspect.ismethod)
            if not name.startswith("_") and name not in RESERVED_METHODS}


def tool_schemas(env) -> list[dict]:
    """The JSON schema of each of ``env``'s tools (``transformers.utils.get_json_schema``)."""
    from transformers.utils import get_json_schema

    schemas = []
    for name, method in tool_methods(env).items():
        try:
            schemas.append(get_json_schema(method))
        except Exception as err:  # noqa: BLE001 - transformers' parsing errors have no common base
            raise EnvError(f"the tool {type(env).__name__}.{name} has no usable schema: {err} (every public method "
                           "of a TRL environment is a tool: give it type hints and a Google-style docstring with "
                           "an Args: section, or make it private with a leading _)") from None
    return schemas


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """The ``<tool_call>{json}</tool_call>`` blocks of ``text`` (Hermes / Qwen2.5 / Qwen3 format),
    in order. A block that is not a JSON object with a string ``name`` and an object ``arguments``
    (or a JSON string holding one) is a :class:`ToolCall` with ``error`` set."""
    calls = []
    for block in _HERMES.findall(text):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError as err:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({err.msg} at character {err.pos})"))
            continue
        name = obj.get("name") if isinstance(obj, dict) else None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(name, str) or not isinstance(args, dict):
            calls.append(ToolCall(name if isinstance(name, str) else "",
                                  error='a tool call must be {"name": "<tool>", "arguments": {...}}'))
            continue
        calls.append(ToolCall(name, args))
    return calls


#: Tool-call formats by name (``task.tool_format``): ``text -> [ToolCall]``.
TOOL_CALL_FORMATS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes}
#: ``task.tool_format``'s choices (the config reads them here), with a note each.
TOOL_FORMATS = {"hermes": 'Qwen2.5 / Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>'}


def parse_tool_calls(text: str, fmt: str = "hermes") -> list[ToolCall]:
    """The tool calls of a model turn ``text`` in format ``fmt`` (:data:`TOOL_CALL_FORMATS`)."""
    if fmt not in TOOL_CALL_FORMATS:
        raise ValueError(f"tool-call format {fmt!r}: known formats are {sorted(TOOL_CALL_FORMATS)}")
    return TOOL_CALL_FORMATS[fmt](text)


def call_tool(tools: dict[str, Callable], call: ToolCall) -> str:
    """Run ``call`` on ``tools`` and return the ``tool`` message's content (``str(result)``; an async
    tool is run to completion). Raises :class:`ToolCallError` when the call cannot be made; whatever
    the tool itself raises propagates."""
    if call.error is not None:
        raise ToolCallError(call.error)
    if call.name not in tools:
        raise ToolCallError(f"there is no tool {call.name!r} (tools: {', '.join(sorted(tools)) or 'none'})")
    method = tools[call.name]
    params = inspect.signature(method).parameters
    try:
        inspect.signature(method).bind(**call.arguments)
    except TypeError as err:
        raise ToolCallError(f"{call.name}({', '.join(params)}): {err}") from None
    result = method(**call.arguments)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    return str(result)


async def _awaited(awaitable):
    return await awaitable


__all__ = ["TOOL_CALL_FORMATS", "TOOL_FORMATS", "ToolCall", "ToolCallError", "call_tool", "parse_hermes",
           "parse_tool_calls", "tool_methods", "tool_schemas"]
