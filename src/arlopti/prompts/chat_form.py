"""Which setting of each data module renders its prompts as chat messages instead of raw text.

A multi-turn environment that starts an episode with a message of its own (its ``reset`` returns one, the
TRL environment contract) or offers tools needs the prompt as chat messages
(:attr:`arlopti.prompts.records.PromptRecord.messages`) to add them to; a raw-text prompt has no place for
them, and the turn loop refuses it (:mod:`arlopti.rollout.turns`). Each data module has its own switch, so
the refusal names them all (issue 45 §3: it named ``data.template=chat, data.chat_template=true``, and the
K&K data module accepts neither: its ``data.template`` is ``official``, ``qwen-instruct`` or ``base``, and
it has no ``chat_template`` key). tests/prompts/test_chat_form.py builds every data module with its
setting and checks that its prompts then carry chat messages, and that every data config is listed.
"""

from __future__ import annotations

#: ``(the data configs, their key, the value that gives chat messages)``, one row per data module.
CHAT_FORM: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("kk", "kk_generated"), "template", "qwen-instruct"),  # K&K: arlopti.tasks.kk.prompts.TEMPLATES
    (("deepscaler", "dsr_uniform", "orz"), "template", "chat"),  # math: arlopti.tasks.math.prompts.TEMPLATES
    (("prompts", "verl_parquet"), "chat_template", "true"),  # any file: arlopti.data.generic_datamodule
)


def chat_form_hint() -> str:
    """``data=kk / kk_generated: data.template=qwen-instruct; data=...: ...``: every data module's switch."""
    return "; ".join(f"data={' / '.join(names)}: data.{key}={value}" for names, key, value in CHAT_FORM)


__all__ = ["CHAT_FORM", "chat_form_hint"]
