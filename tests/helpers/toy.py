"""A toy task and DataModule so learner tests need no real task data."""

from __future__ import annotations

import lightning.pytorch as L

from arlopti.data.prompt_datamodule import PromptDataModule, PromptRecord
from arlopti.tasks.base import RewardResult, Task, register_task, _TASKS


class ToyTask(Task):
    """Reward = number of distinct characters in the response, mod 4: varied within a group."""

    name = "toy"

    def score(self, responses, ground_truths, metas):
        out = []
        for r in responses:
            v = float(len(set(r)) % 4)
            out.append(RewardResult(v, v == 3.0, {"distinct": float(len(set(r)))}))
        return out


if "toy" not in _TASKS:
    register_task("toy")(ToyTask)


class ToyDataModule(PromptDataModule):
    task_name = "toy"

    def __init__(self, n: int = 32, **kw):
        super().__init__(**kw)
        self.n = n

    def train_records(self):
        return [PromptRecord(uid=f"toy/{i}", ground_truth=None, task="toy",
                             text=f"Zoey said that Oliver is a knight {i}.") for i in range(self.n)]


def toy_trainer(callbacks=(), **kw) -> L.Trainer:
    from arlopti.callbacks.rollout import RolloutCallback

    args = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                enable_progress_bar=False, enable_model_summary=False)
    group = kw.pop("group_size", 4)  # the callback's, not a Trainer argument
    args.update(kw)
    return L.Trainer(callbacks=[RolloutCallback(group_size=group), *callbacks], **args)
