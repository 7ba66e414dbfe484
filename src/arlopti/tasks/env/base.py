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
``get_reward`` is not called (the environment reward is what the steps gave). An episode's process that
sends its worker host a broken message (a partial one, or one over the host's bound) is killed and fails
the same way, alone (:mod:`arlopti.tasks.env.worker_host`). A reply over ``rollout.max_reply_tokens``
tokens is replaced by an error reply. A tool (or ``step``, ``reset``, ``get_reward``) failing on more
than ``task.max_error_frac`` of its own calls of the last ``task.error_window`` steps stops the run,
naming the environment and that tool with its failures, as reward functions do
(:mod:`arlopti.rollout.env_calls`; checked as the failures come in, as soon as the outcome is certain),
and the run saves ``last.ckpt`` first and names it. ``step`` may also return the pair ``(reply, done)``
(reward None). Any other shape, a ``done`` that is not a bool (or the int 0 or 1), and a reward
(``step``'s, or ``get_reward()``'s) that is not a finite float (a string, a bool, NaN, infinity, an int
too large for a float) stop the run with one line naming the class, the call and the value
(:func:`check_step_value`). A ``reset`` that raises, times out or returns something other than a string or
None stops the run.
"""

from __future__ import annotations

import inspect
import math
import numbers
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


def shown(value, limit: int = 80) -> str:
    """``value``'s repr in at most ``limit`` characters and ``...`` (an int too long even for ``repr``: its
    first digits)."""
    try:
        text = repr(value)
    except ValueError:  # an int over sys.get_int_max_str_digits: its leading digits, computed without str()
        lead = abs(value) // 10 ** (_digits(value) - 30)
        return f"{'-' if value < 0 else ''}{lead}..."
    return text if len(text) <= limit else f"{text[:limit]}..."


def _digits(value: int) -> int:
    """How many decimal digits ``value`` has (within one, for an int too long for ``str``)."""
    try:
        return len(str(abs(value)))
    except ValueError:
        return int(abs(value).bit_length() * math.log10(2))


def _typed(value) -> str:
    """``value`` shown with its type (and a long int's number of digits): what an error names."""
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**80:
        return f"{shown(value)} ({article} {name}, {_digits(value)} digits)"
    return f"{shown(value)} ({article} {name})"


def check_done(env_name: str, done) -> bool:
    """``step``'s ``done`` as a bool: True, False, or the ints 1 and 0. Anything else (``"no"`` is truthy) is an
    :class:`EnvError` naming the environment, the call and the value."""
    if isinstance(done, bool):
        return done
    if isinstance(done, numbers.Integral) and done in (0, 1):
        return bool(done)
    raise EnvError(f"the environment {env_name}: step returned done={_typed(done)}; done must be a bool "
                   "(True or False; the ints 0 and 1 are read as such)")


def check_reward(env_name: str, call: str, reward, where: str = "", optional: bool = True) -> float | None:
    """A reward returned by ``call`` (``step``: None allowed when ``optional``; ``get_reward``) as a finite
    float; anything else (a bool, a string, NaN, infinity, an int too large for a float) is an
    :class:`EnvError` naming the environment, the call and the value (``where``: e.g. `` on prompt p/0``)."""
    if reward is None and optional:
        return None
    problem = None
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        problem = f"the reward {_typed(reward)}"
    else:
        try:
            value = float(reward)
        except OverflowError:
            value, problem = math.inf, f"the reward {_typed(reward)}, too large for a float"
        if problem is None and not math.isfinite(value):
            problem = f"a non-finite reward {value}"
    if problem is None:
        return value
    allowed = " (or None)" if optional else ""
    raise EnvError(f"the environment {env_name}: {call} returned {problem}{where}; a reward must be a finite "
                   f"float{allowed}, and the run stops rather than train on it")


#: What ``step`` must return (:func:`check_step_value`).
STEP_CONTRACT = "step must return (reply: str | None, done: bool, reward: float | None) or (reply, done)"


def check_step_value(env_name: str, value) -> tuple[str | None, bool, float]:
    """``(reply, done, reward)`` of what ``step`` returned: a triple, or the pair ``(reply, done)`` (reward
    None, counting 0). The shape, ``done`` (:func:`check_done`) and the reward (:func:`check_reward`) are
    checked; a break is an :class:`EnvError` naming the environment, the call and the value."""
    shaped = isinstance(value, (tuple, list)) and len(value) in (2, 3)
    shaped = shaped and (value[0] is None or isinstance(value[0], str))
    reward = value[2] if shaped and len(value) == 3 else None
    if not shaped or isinstance(reward, bool) or not (reward is None or isinstance(reward, numbers.Real)):
        raise EnvError(f"the environment {env_name}: {STEP_CONTRACT}, and returned {shown(value, 120)}")
    done = check_done(env_name, value[1])
    reward = check_reward(env_name, "step", reward)
    return value[0], done, 0.0 if reward is None else reward


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


__all__ = ["EnvError", "RESERVED_METHODS", "STEP_CONTRACT", "TextEnv", "ToolEnv", "check_done", "check_reward",
           "check_step_value", "is_text_env", "shown"]
