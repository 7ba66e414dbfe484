"""The two environment contracts a multi-turn episode runs against (``task.env``; docs/multi_turn.md).

**The text contract** (:class:`TextEnv`), for models without a tool template (SmolLM2) and for any
protocol of your own made of plain text::

    class MyEnv(TextEnv):
        def reset(self, row: dict) -> str | None: ...            # the first user message, or None
        def step(self, text: str) -> tuple[str | None, bool, float | None]: ...  # or (reply, done)
        def close(self) -> None: ...                              # optional

``step`` receives the model's turn as text (decoded, special tokens dropped) and returns
``(reply, done, reward)``: the environment's reply to the turn (None: no reply), whether the episode
is done, and an optional reward for this turn (None counts as 0). The episode's environment reward
is the sum of the turn rewards. A class is taken for a text environment when it subclasses
:class:`TextEnv`, or when it defines ``step`` with exactly one parameter named ``text``
(:func:`is_text_env`).

**TRL's contract** (``GRPOTrainer(environment_factory=...)``), unchanged (:class:`ToolEnv` documents
it; no base class is needed)::

    class MyToolEnv:
        def reset(self, **row) -> str | None: ...                 # required
        def get_reward(self) -> float: ...                        # optional, called once per episode
        def some_tool(self, x: int) -> int:                       # every other public method is a tool
            \"\"\"What it does.

            Args:
                x: What x is.
            \"\"\"

The public methods (name not starting with ``_``; not ``reset``, ``get_reward``, ``close``) are the
tools; their type hints and Google-style docstrings become the JSON schema the chat template is
given (``transformers.utils.get_json_schema``, :mod:`arlopti.tasks.env.tools`). The model calls a
tool in its chat template's format (Qwen2.5 / Hermes: ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``); a turn without a tool call ends the episode (it is the final answer).

**What both receive.** ``row`` is the prompt record: its metadata (a custom data file's other
columns; K&K's and math's ``meta``) plus ``prompt`` (the chat messages, or the prompt text),
``ground_truth`` (the answer column, None without one) and ``uid``. One environment instance is
built (``Cls()``, no argument) per episode and reset once; :meth:`TextEnv.close` (or a ``close``
method of a TRL environment) is called when the episode ends.

**The first message.** A string returned by ``reset`` joins the prompt: the text contract appends it
as a new user message after the prompt's messages; TRL's appends it to the content of the prompt's
last message (as TRL does). Either needs a chat prompt (``messages``): a raw-text prompt (e.g. K&K's
``template=official``) with a first message, or with tools, is refused with an error naming the
prompt. The G episodes of a prompt start from the same state: each ``reset`` (and every later call)
runs with Python's ``random`` seeded from the step's seed and the prompt (the same seed for the G
resets of a prompt; the trainer's own ``random`` state is put back after the call), and their first
messages must be equal (an error otherwise: derive any other randomness from the row).

**How a reply is encoded** (never re-encoding earlier turns; :mod:`arlopti.rollout.chat_encoding`):
after a model turn that ended on its end-of-turn token, a text reply is a user message of the chat
template and a TRL tool result a ``tool`` message, each encoded as the difference of the template
applied with and without that message (the generation prompt of the next turn included); after a
turn stopped by a stop string (``rollout.stop``: e.g. ``"```output"``), the reply is plain text that
continues the same assistant message; a tokenizer without a chat template always gets plain text.
``turn_prefix`` (a class attribute, default empty) is text placed after the generation prompt of
every later model turn (e.g. K&K's ``"<think>"``); it is environment text (not trained on).

**Where the instances live** (:mod:`arlopti.rollout.env_calls`): each episode's instance in a worker
process of its own (:mod:`arlopti.tasks.env.workers`), when a fresh interpreter can import the class by
name (``task.env=path/to/file.py:Class`` or ``module:Class``, or a class given to ``arlopti.run`` that is
defined at the top level of a module file); the calls of different episodes then run at the same time.
A class defined in ``__main__``, a notebook or a function runs in the trainer's process instead (a
warning says so): calls one at a time, a timed-out call abandoned in its thread, not killed.

**Failures** (counted, never fatal unless too many): a ``step`` or a tool that raises gives the reply
``"error: <Exception>: <message>"`` and the episode goes on; one past ``task.env_timeout_s`` seconds
gives the reply ``"error: the call did not return within <t> s"`` and its process is killed; one whose
process ends (``os._exit``, a crash, a signal) gives the one-line reply ``"error: EnvWorkerDied:
<Class>.<call>: the episode's environment process exited with code <n> during the call"``. After either
of the last two the environment is not called again: the model's next turn is the final answer, and
``get_reward`` is not called (the environment reward is what the steps gave). A reply over
``rollout.max_reply_tokens`` tokens is replaced by an error reply. A tool (or ``step``, ``reset``,
``get_reward``) failing on more than ``task.max_error_frac`` of its own calls of the last
``task.error_window`` steps stops the run, naming the environment and that tool with its failures, as
reward functions do (:mod:`arlopti.rollout.env_calls`; checked as the failures come in, as soon as the
outcome is certain), and the run saves ``last.ckpt`` first and names it. ``step`` may also return the
pair ``(reply, done)`` (reward None); any other shape, a non-finite step reward, and a ``get_reward()``
that is not a number or is NaN or infinite stop the run naming the environment.
A ``reset`` that raises, times out or returns something other than a string or None stops the run.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Protocol, runtime_checkable

#: The methods of a TRL environment that are not tools.
RESERVED_METHODS = ("reset", "get_reward", "close")


class TextEnv(ABC):
    """The text contract (module docstring). Subclass it, or write a class with the same methods."""

    #: Text after the generation prompt of every later model turn (environment text, not trained on).
    turn_prefix: str = ""

    @abstractmethod
    def reset(self, row: dict) -> str | None:
        """Start an episode on the prompt record ``row``; return the first user message, or None."""

    @abstractmethod
    def step(self, text: str) -> tuple[str | None, bool, float | None]:
        """The model's turn ``text`` -> ``(reply or None, done, reward for this turn or None)``."""

    def close(self) -> None:
        """Release what the episode holds (a temporary folder, a process). Called once, at its end."""


@runtime_checkable
class ToolEnv(Protocol):
    """TRL's ``environment_factory`` contract (module docstring): ``reset(**row)``, an optional
    ``get_reward()``, and every other public method a tool. Documentation only: no base class is
    needed, any class with a ``reset`` that is not a text environment is taken for one."""

    def reset(self, **row) -> str | None:
        ...


class EnvError(RuntimeError):
    """An environment broke the contract or failed beyond ``task.max_error_frac``: the run stops,
    and the message names the environment and what it did."""


def is_text_env(cls: type) -> bool:
    """Whether ``cls`` follows the text contract: a :class:`TextEnv` subclass, or a class whose
    ``step`` takes exactly one parameter and it is named ``text`` (module docstring)."""
    if isinstance(cls, type) and issubclass(cls, TextEnv):
        return True
    step = getattr(cls, "step", None)
    if not callable(step):
        return False
    try:
        params = [p for p in inspect.signature(step).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].name == "text"


__all__ = ["EnvError", "RESERVED_METHODS", "TextEnv", "ToolEnv", "is_text_env"]
