"""The prompt batch that flows from a DataModule to the rollout callback.

A :class:`PromptBatch` carries unpadded prompt token ids plus everything the task's reward
needs. It deliberately holds Python lists, not tensors: the rollout engine pads them itself
(left padding for HF ``generate``; vLLM takes ragged token lists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptSample:
    prompt_ids: list[int]
    prompt_text: str
    ground_truth: Any
    task: str
    uid: str  # stable id of the prompt (e.g. "kk/train/123"); one GRPO group per uid per step
    meta: dict = field(default_factory=dict)  # e.g. {"n_people": 3, "split": "test"}
    # The chat messages it was rendered from (None: a raw-text prompt) and the text after the generation
    # prompt: what a multi-turn environment re-renders the prompt from (tools, a first message).
    messages: list[dict] | None = None
    assistant_prefix: str = ""


@dataclass
class PromptBatch:
    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    ground_truths: list[Any]
    tasks: list[str]
    uids: list[str]
    metas: list[dict]
    # (epoch, index of the batch's first sample in that epoch's order); lets the DataModule
    # record what was consumed so a resumed run continues exactly where it stopped.
    position: tuple[int, int] = (0, 0)
    # Set by the rollout callback: the sampled responses and rewards of this batch.
    experience: Any = None
    # Per prompt, as PromptSample's (None: not known, e.g. a batch built by hand).
    messages: list[list[dict] | None] | None = None
    assistant_prefixes: list[str] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, idx: list[int]) -> "PromptBatch":
        return PromptBatch(
            prompt_ids=[self.prompt_ids[i] for i in idx],
            prompt_texts=[self.prompt_texts[i] for i in idx],
            ground_truths=[self.ground_truths[i] for i in idx],
            tasks=[self.tasks[i] for i in idx],
            uids=[self.uids[i] for i in idx],
            metas=[self.metas[i] for i in idx],
            position=self.position,
            messages=None if self.messages is None else [self.messages[i] for i in idx],
            assistant_prefixes=None if self.assistant_prefixes is None else [self.assistant_prefixes[i] for i in idx],
        )


def collate_prompts(samples: list[PromptSample], position: tuple[int, int] = (0, 0)) -> PromptBatch:
    return PromptBatch(
        prompt_ids=[s.prompt_ids for s in samples],
        prompt_texts=[s.prompt_text for s in samples],
        ground_truths=[s.ground_truth for s in samples],
        tasks=[s.task for s in samples],
        uids=[s.uid for s in samples],
        metas=[s.meta for s in samples],
        position=position,
        messages=[s.messages for s in samples],
        assistant_prefixes=[s.assistant_prefix for s in samples],
    )
