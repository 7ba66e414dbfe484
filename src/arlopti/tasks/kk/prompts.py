"""K&K prompt templates: the official prompt (data), or our wording of the Logic-RL instructions.

* ``official``: the record's own ``prompt`` field (:attr:`Puzzle.prompt`), fed **verbatim**, as
  the official runs do (AR-Lopti's ``RLHFDataset`` tokenises ``prompt[0].content`` as is, with no
  chat template and no special tokens added). The string already holds the Qwen chat markup
  (system block, user block with the quiz, ``<|im_start|>assistant\n``) and ends in ``<think>``.
  It is data, read from the files (the shared fixtures ``fixtures/kk/kk_*.jsonl[.gz]`` carry it for
  all 5,000 puzzles); nothing of it is written here. A puzzle without it raises ``ValueError``.
  Rendered as ``PromptRecord(text=prompt, assistant_prefix="")``. ``configs/data/kk.yaml`` (and so
  every ``kk_*`` experiment) uses it.
* ``qwen-instruct``: chat messages ``[system: instructions, user: quiz]`` plus the assistant turn
  pre-filled with ``<think>``. The model's own chat template renders them (nothing Qwen-specific is
  hard-coded here), via :class:`arlopti.prompts.records.PromptRecord` with
  ``messages=...`` and ``assistant_prefix="<think>"``. ``configs/data/kk_generated.yaml`` uses it
  (our generator's puzzles have no official prompt).
* ``base``: one completion text ``"<instructions>\n\nUser: <quiz>\nAssistant: <think>"`` for base
  models without a chat template.

All three end in ``<think>``, which is why the reward scores ``"<think>" + response``.
"""

from __future__ import annotations

from dataclasses import dataclass

from arlopti.prompts.records import PromptRecord, render_prompt
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
OFFICIAL = "official"
TEMPLATES = (OFFICIAL, "qwen-instruct", "base")


@dataclass(frozen=True)
class PromptPieces:
    """What a :class:`PromptRecord` needs: ``text`` (official, base) or ``messages`` (chat), and the prefix.

    ``rendered`` is the exact prompt string when :func:`build_prompt` was given a tokenizer.
    """

    template: str
    text: str | None = None
    messages: tuple[dict, ...] | None = None
    assistant_prefix: str = ""
    rendered: str | None = None

    def to_prompt_record(self, uid: str, ground_truth, task: str = "kk", meta: dict | None = None):
        """A :class:`arlopti.prompts.records.PromptRecord` with these pieces."""

        return PromptRecord(uid=uid, ground_truth=ground_truth, task=task, text=self.text,
                            messages=[dict(m) for m in self.messages] if self.messages else None,
                            assistant_prefix=self.assistant_prefix, meta=dict(meta or {}))


def official_prompt(puzzle: Puzzle) -> str:
    """The puzzle's own official prompt (its ``prompt`` field), verbatim.

    Raises ``ValueError`` when the puzzle has none, or when it does not end in ``<think>`` (the
    reward pre-fills that tag, see :mod:`arlopti.tasks.kk.reward`).
    """
    what = f"K&K puzzle (N={puzzle.num_people}, index={puzzle.index})"
    if puzzle.prompt is None:
        raise ValueError(f"{what} has no 'prompt' field, which the prompt template 'official' feeds "
                         "verbatim; use the template 'qwen-instruct' (data.template=qwen-instruct), or "
                         "records that carry the official 'prompt' field (the shared fixtures fixtures/kk)")
    if not puzzle.prompt.endswith(THINK_PREFIX):
        raise ValueError(f"{what}: its 'prompt' field does not end in {THINK_PREFIX!r}, which the K&K "
                         "reward assumes (it scores '<think>' + response); it is not an official prompt")
    return puzzle.prompt


def build_prompt(puzzle: Puzzle, template: str = "qwen-instruct", tokenizer=None) -> PromptPieces:
    """The prompt pieces of ``puzzle`` for ``template`` (see module docstring).

    With a ``tokenizer`` the prompt is also rendered (chat template applied, prefix appended) into
    ``rendered``; a chat template on a tokenizer without one raises ``ValueError``. An unknown
    ``template`` raises ``ValueError`` listing the known ones, and so does ``official`` for a puzzle
    without a ``prompt`` (see :func:`official_prompt`).
    """
    if template == OFFICIAL:
        pieces = PromptPieces(template=template, text=official_prompt(puzzle), assistant_prefix="")
    elif template == "qwen-instruct":
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

    rendered = render_prompt(pieces.to_prompt_record(uid="kk/render", ground_truth=None), tokenizer)
    return PromptPieces(template=pieces.template, text=pieces.text, messages=pieces.messages,
                        assistant_prefix=pieces.assistant_prefix, rendered=rendered)
