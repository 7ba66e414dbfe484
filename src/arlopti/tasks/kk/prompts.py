"""K&K prompt templates (our wording of the Logic-RL instructions).

* ``qwen-instruct``: chat messages ``[system: instructions, user: quiz]`` plus the assistant turn
  pre-filled with ``<think>``. The model's own chat template renders them (nothing Qwen-specific is
  hard-coded here), via :class:`arlopti.data.prompt_datamodule.PromptRecord` with
  ``messages=...`` and ``assistant_prefix="<think>"``.
* ``base``: one completion text ``"<instructions>\\n\\nUser: <quiz>\\nAssistant: <think>"`` for base
  models without a chat template.

Both end in ``<think>``, which is why the reward scores ``"<think>" + response``.
"""

from __future__ import annotations

from dataclasses import dataclass

from arlopti.tasks.kk.puzzle import Puzzle

SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks through the reasoning process and then "
    "gives the user the answer. The reasoning goes inside <think> </think> tags and the answer inside "
    "<answer> </answer> tags, i.e. <think> reasoning here </think> <answer> answer here </answer>. "
    "The user asks you to solve a logical reasoning puzzle. When you reach a conclusion, state the "
    "identity of each character inside the answer tags, in this form: "
    "<answer> (1) Zoey is a knight\n(2) Oliver is a knave\n... </answer>."
)
THINK_PREFIX = "<think>"
TEMPLATES = ("qwen-instruct", "base")


@dataclass(frozen=True)
class PromptPieces:
    """What a :class:`PromptRecord` needs: ``text`` (base) or ``messages`` (chat), and the prefix.

    ``rendered`` is the exact prompt string when :func:`build_prompt` was given a tokenizer.
    """

    template: str
    text: str | None = None
    messages: tuple[dict, ...] | None = None
    assistant_prefix: str = ""
    rendered: str | None = None

    def to_prompt_record(self, uid: str, ground_truth, task: str = "kk", meta: dict | None = None):
        """A :class:`arlopti.data.prompt_datamodule.PromptRecord` with these pieces."""
        from arlopti.data.prompt_datamodule import PromptRecord  # imports Lightning: keep it lazy

        return PromptRecord(uid=uid, ground_truth=ground_truth, task=task, text=self.text,
                            messages=[dict(m) for m in self.messages] if self.messages else None,
                            assistant_prefix=self.assistant_prefix, meta=dict(meta or {}))


def build_prompt(puzzle: Puzzle, template: str = "qwen-instruct", tokenizer=None) -> PromptPieces:
    """The prompt pieces of ``puzzle`` for ``template`` (see module docstring).

    With a ``tokenizer`` the prompt is also rendered (chat template applied, prefix appended) into
    ``rendered``; a chat template on a tokenizer without one raises ``ValueError``. An unknown
    ``template`` raises ``ValueError`` listing the known ones.
    """
    if template == "qwen-instruct":
        pieces = PromptPieces(
            template=template,
            messages=({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": puzzle.quiz}),
            assistant_prefix=THINK_PREFIX,
        )
    elif template == "base":
        text = f"{SYSTEM_PROMPT}\n\nUser: {puzzle.quiz}\nAssistant: {THINK_PREFIX}"
        pieces = PromptPieces(template=template, text=text)
    else:
        raise ValueError(f"unknown K&K prompt template {template!r}; known templates: {list(TEMPLATES)}")
    if tokenizer is None:
        return pieces
    from arlopti.data.prompt_datamodule import render_prompt

    rendered = render_prompt(pieces.to_prompt_record(uid="kk/render", ground_truth=None), tokenizer)
    return PromptPieces(template=pieces.template, text=pieces.text, messages=pieces.messages,
                        assistant_prefix=pieces.assistant_prefix, rendered=rendered)
