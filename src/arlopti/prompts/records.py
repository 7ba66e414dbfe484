"""A prompt before tokenisation (:class:`PromptRecord`), how it is rendered with a tokenizer, and
how records become :class:`~arlopti.prompts.batch.PromptSample` lists.

Lightning-free and importing nothing above it, so that tasks/ (which build records) and eval/
import it downward; :mod:`arlopti.data.prompt_datamodule` builds its DataModules on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from arlopti.prompts.batch import PromptSample

log = logging.getLogger(__name__)


@dataclass
class PromptRecord:
    """A prompt before tokenisation. Either ``text`` (used verbatim) or ``messages`` (chat)."""

    uid: str
    ground_truth: Any
    task: str
    text: str | None = None
    messages: list[dict] | None = None
    # Appended after the chat template's generation prompt, e.g. "<think>" for K&K.
    assistant_prefix: str = ""
    meta: dict = field(default_factory=dict)


def render_prompt(record: PromptRecord, tokenizer) -> str:
    if record.text is not None:
        return record.text + record.assistant_prefix
    if record.messages is None:
        raise ValueError(f"prompt {record.uid}: a record needs 'text' or 'messages'")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"prompt {record.uid}: this template needs a chat template but the tokenizer has none; "
            "use a raw/base template for base models"
        )
    text = tokenizer.apply_chat_template(record.messages, tokenize=False, add_generation_prompt=True)
    return text + record.assistant_prefix


def tokenize_records(
    records: list[PromptRecord], tokenizer, max_prompt_length: int, what: str
) -> tuple[list[PromptSample], int]:
    """Tokenise records, dropping (not truncating) those over ``max_prompt_length`` tokens."""
    samples, dropped = [], 0
    texts = [render_prompt(r, tokenizer) for r in records]
    # Chat templates already contain any special tokens the model needs.
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    for rec, text, ids in zip(records, texts, encoded):
        if len(ids) > max_prompt_length:
            dropped += 1
            continue
        samples.append(
            PromptSample(
                prompt_ids=list(ids), prompt_text=text, ground_truth=rec.ground_truth,
                task=rec.task, uid=rec.uid, meta=dict(rec.meta),
                messages=None if rec.messages is None else [dict(m) for m in rec.messages],
                assistant_prefix=rec.assistant_prefix,
            )
        )
    if dropped:
        log.warning("%s: dropped %d of %d prompts longer than max_prompt_length=%d",
                    what, dropped, len(records), max_prompt_length)
    return samples, dropped
