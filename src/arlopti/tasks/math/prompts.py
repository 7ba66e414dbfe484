"""The math prompt: the problem followed by the official instruction suffix.

The paper trains base Qwen2.5-7B on one user turn, problem + :data:`SUFFIX`, with no chat
template (template ``raw``). ``chat`` wraps the same text as one user message for
instruct models; the tokenizer's chat template then renders it.
"""

from __future__ import annotations

SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
TEMPLATES = ("raw", "chat")


def prompt_text(problem: str) -> str:
    """The official prompt text: ``problem + SUFFIX``."""
    return problem + SUFFIX


def build_prompt(problem: str, template: str = "raw") -> dict:
    """``{"text": ...}`` for ``raw`` or ``{"messages": [...]}`` for ``chat``.

    The dict holds exactly the keyword arguments a :class:`~arlopti.prompts.records.PromptRecord`
    needs for the prompt. Raises ValueError for an unknown template.
    """
    if template == "raw":
        return {"text": prompt_text(problem)}
    if template == "chat":
        return {"messages": [{"role": "user", "content": prompt_text(problem)}]}
    raise ValueError(f"math template {template!r} is unknown; known templates: {list(TEMPLATES)}")


def strip_suffix(text: str) -> str:
    """``text`` without a trailing :data:`SUFFIX`; else unchanged.

    The exact suffix is removed exactly (the official prompt is problem + SUFFIX, so what is left is
    the problem byte for byte, whitespace included); a suffix with other surrounding whitespace is
    removed with that whitespace."""
    if text.endswith(SUFFIX):
        return text[: -len(SUFFIX)]
    stripped = text.rstrip()
    core = SUFFIX.strip()
    if stripped.endswith(core):
        return stripped[: -len(core)].rstrip()
    return text
