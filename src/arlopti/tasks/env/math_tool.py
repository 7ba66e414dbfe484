"""Math with a Python tool (ToRL / ReTool style): the model writes code, the environment runs it and
shows the output, and the final answer is graded by the math task's official grader.

Two environments, one per contract (:mod:`arlopti.tasks.env.base`), both running code with
:func:`arlopti.tasks.env.python_tool.run_python` (a fresh interpreter with limits inside an OS sandbox,
bubblewrap; :mod:`arlopti.tasks.env.sandbox` and docs/multi_turn_envs.md say what it allows):

* :class:`MathToolEnv` (text contract, for models without a tool template, e.g. SmolLM2): its first
  message (:data:`INSTRUCTION`, a user message after the problem; the prompt must be chat messages,
  ``data.template=chat``) says how to use the tool: code in a Markdown block fenced with
  ````` ```python `````. Each model turn's Python blocks are joined in order and run as one program;
  the reply is the output in a ````` ```output ````` block. A turn that ends inside an output block
  (it stopped on ``rollout.stop: ["```output"]``, the ToRL protocol: Qwen2.5-Math writes that fence
  itself) gets the output and the closing fence as plain text continuing its message. A turn with no
  Python block, or with a ``\\boxed`` answer after its last block, is the final answer: the episode
  ends there and the math task grades that turn (``task=math``, the official grader).
* :class:`MathPythonTool` (TRL's contract, for tool-template models such as Qwen2.5-Instruct): one
  tool, ``python(code)``, returning the output. The model calls it in its chat template's format
  (``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``); a turn without a call
  is the final answer.

Every run is independent: nothing defined in one turn's code exists in the next (as in ToRL). A
failing program (an exception, a timeout, a memory or output limit) is the model's mistake, not the
environment's: its traceback or the limit it hit is the reply, and it is not an environment error
(``task.max_error_frac`` counts only calls of the environment that raise or hang). The limits are the
class attribute ``limits`` (:class:`~arlopti.tasks.env.python_tool.PythonLimits`; subclass to change
them: one instance is built per episode with no argument). ``limits.wall_s`` must stay under
``task.env_timeout_s`` (default 30 s), or the call is abandoned as a timeout first.

Building an instance checks that the sandbox works on this machine (the run's probe instance does it at
start-up) and refuses in one line naming the fix where it does not. The class attribute ``sandbox =
False`` is the explicit opt-out: the code then runs with the trainer's user rights, files and network
(only the limits hold), and a warning says so when the first instance is built.
"""

from __future__ import annotations

import logging
import re

from arlopti.tasks.env.base import TextEnv
from arlopti.tasks.env.python_tool import PythonLimits, run_python
from arlopti.tasks.env.sandbox import require_sandbox

log = logging.getLogger(__name__)
_WARNED: set[type] = set()

#: The text contract's first message (a user message after the problem).
INSTRUCTION = ("You may run Python code to help you. Write the code in a Markdown block that starts with "
               "```python and ends with ```; after the block I will reply with what it prints, in a block that "
               "starts with ```output. Each block runs on its own, so print what you need. When you know the "
               "answer, write it within \\boxed{} without a code block.")
OUTPUT_FENCE = "```output"
# An opening fence ```python / ```py (any case) on its own line, the code, then a closing fence or the end.
_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def code_blocks(text: str) -> list[tuple[int, str]]:
    """``(end offset, code)`` of every Python block of ``text``, in order; an unclosed last block runs to
    the end of the text (a turn cut by a stop string or its token limit)."""
    return [(m.end(), m.group(1)) for m in _BLOCK.finditer(text)]


def turn_code(text: str) -> str | None:
    """The program a turn asks to run: its Python blocks joined in order, or None when the turn is a
    final answer (no block, or a ``\\boxed`` after the last block)."""
    blocks = code_blocks(text)
    if not blocks or "\\boxed" in text[blocks[-1][0]:]:
        return None
    return "\n".join(code for _, code in blocks)


def output_reply(text: str, output: str) -> str:
    """The reply to a turn whose code printed ``output``: the output block, or, when the turn already
    opened it (it ends in ```` ```output ````), the rest of that block."""
    body = output if output.endswith("\n") or not output else output + "\n"
    if text.rstrip().endswith(OUTPUT_FENCE):
        return f"\n{body}```\n"
    return f"{OUTPUT_FENCE}\n{body}```\n"


class _Runner:
    """What both environments share: :meth:`_run` runs a program under :attr:`limits` and keeps the
    status of each run of the episode in :attr:`runs` (:data:`~arlopti.tasks.env.python_tool.STATUSES`).
    Override :meth:`_run` to send the code elsewhere (a container, a sandbox service:
    docs/multi_turn_envs.md); it returns the text the model is shown and never raises for the code's
    own failures."""

    limits: PythonLimits = PythonLimits()
    #: Run the code in the OS sandbox (module docstring); False is the explicit, warned opt-out.
    sandbox: bool = True

    def __init__(self):
        self.runs: list[str] = []
        if self.sandbox:
            require_sandbox()
        elif type(self) not in _WARNED:
            _WARNED.add(type(self))
            log.warning("%s.sandbox = False: model-written code runs WITHOUT the OS sandbox, with this process's "
                        "user rights, files and network (only the CPU, memory, file-size and wall-clock limits "
                        "hold); use it only for code you trust", type(self).__name__)

    def _run(self, code: str) -> str:
        result = run_python(code, self.limits, sandbox=self.sandbox)
        self.runs.append(result.status)
        return result.reply()


class MathToolEnv(_Runner, TextEnv):
    """The text-contract math-tool environment (module docstring)."""

    #: The first message, or None to send none (the prompt then has to explain the tool itself).
    instruction: str | None = INSTRUCTION

    def reset(self, row: dict) -> str | None:
        self.runs = []
        return self.instruction

    def step(self, text: str) -> tuple[str | None, bool, float | None]:
        code = turn_code(text)
        if code is None:
            return None, True, None
        return output_reply(text, self._run(code)), False, None


class MathPythonTool(_Runner):
    """TRL's contract: one tool, :meth:`python` (module docstring). ``reset`` sends no first message:
    the chat template shows the tool's schema to the model."""

    def reset(self, **row) -> str | None:
        self.runs = []
        return None

    def python(self, code: str) -> str:
        """Run a Python program and return what it prints (stdout and stderr); each call starts a fresh interpreter.

        Args:
            code: The Python source to run; print every value you need to see.
        """
        return self._run(str(code))


__all__ = [
    "INSTRUCTION",
    "OUTPUT_FENCE",
    "MathPythonTool",
    "MathToolEnv",
    "code_blocks",
    "output_reply",
    "turn_code",
]
