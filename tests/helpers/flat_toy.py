"""A toy task whose groups carry signal or not by the prompt, for DAPO dynamic-sampling tests.

Prompt ``i`` is ``"Zoey said that Oliver is a knight {i}."``; :class:`FlatToyDataModule` marks the
prompts of its ``flat`` set in their meta. :class:`FlatToyTask` scores a flat prompt's responses
0 each (all equal: no signal) and any other's by its text length (with :class:`SpyEngine`'s
varied-length fixed responses: not all equal). :class:`SpyEngine` is
:class:`helpers.fixed_rollouts.FixedEngine` (responses depend on the prompt and the sample index
only, whatever the rank) that records the prompt indices of every ``generate`` call.
"""

from __future__ import annotations

import re

from arlopti.data.prompt_datamodule import PromptDataModule, PromptRecord
from arlopti.tasks.base import RewardResult, Task, _TASKS, register_task
from helpers.fixed_rollouts import FixedEngine


class FlatToyTask(Task):
    name = "flat_toy"

    def score(self, responses, ground_truths, metas):
        return [RewardResult(0.0 if m["flat"] else float(len(r)), False, {"length": float(len(r))})
                for r, m in zip(responses, metas)]


if "flat_toy" not in _TASKS:
    register_task("flat_toy")(FlatToyTask)


class FlatToyDataModule(PromptDataModule):
    task_name = "flat_toy"

    def __init__(self, n: int = 16, flat=(), **kw):
        super().__init__(**kw)
        self.n, self.flat = n, set(flat)

    def train_records(self):
        return [PromptRecord(uid=f"flat_toy/{i}", ground_truth=i, task="flat_toy",
                             text=f"Zoey said that Oliver is a knight {i}.", meta={"flat": i in self.flat})
                for i in range(self.n)]


def prompt_index(text: str) -> int:
    return int(re.search(r"knight (\d+)\.", text).group(1))


class SpyEngine(FixedEngine):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, min_len=2)
        self.calls: list[list[int]] = []  # prompt indices of each generate call

    def generate(self, prompt_ids, n, sampling):
        self.calls.append([prompt_index(self.tokenizer.decode(p)) for p in prompt_ids])
        return super().generate(prompt_ids, n, sampling)
