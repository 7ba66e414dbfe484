"""``PromptDataModule.batch_ahead``: the batch j steps later is the one the loader yields then, across
an epoch boundary and on every rank (rollout.placement=server generates it ahead)."""

from __future__ import annotations

import pytest

from helpers.toy import ToyDataModule


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1)])
def test_the_batch_ahead_is_the_one_the_loader_yields_later(tiny_tokenizer, world, rank):
    dm = ToyDataModule(n=12, tokenizer=tiny_tokenizer, prompts_per_step=4, max_prompt_length=256, seed=5)
    dm.setup("fit")
    dm._sampler.world_size, dm._sampler.rank = world, rank
    seen = []
    for epoch in range(3):  # 3 batches per epoch: the look-ahead crosses two epoch boundaries
        dm._sampler.set_epoch(epoch)
        seen += list(dm.train_dataloader())
    for i, batch in enumerate(seen):
        for j in range(len(seen) - i):
            ahead = dm.batch_ahead(batch.position, j)
            assert ahead.prompt_ids == seen[i + j].prompt_ids and ahead.position == seen[i + j].position
