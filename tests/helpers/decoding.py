"""Left-padded prompt batches and step-by-step logits for the decoding-step tests (test_hf_kv_decode,
test_packed_linear)."""

from __future__ import annotations

import torch

TEXTS = ["Zoey said that Oliver is a knight.", "Is Ava a knave?", "A very long prompt " * 5, "Hi"]


def prompt_ids(tok, rows: int = 4) -> list[list[int]]:
    """``rows`` prompts of different lengths (the texts cycled)."""
    return [tok(TEXTS[r % len(TEXTS)])["input_ids"] for r in range(rows)]


def left_padded_batch(tok, rows: int = 4):
    """``(ids, mask, positions)`` of :func:`prompt_ids`, left-padded as the HF engine pads them."""
    prompts = prompt_ids(tok, rows)
    width = max(map(len, prompts))
    ids = torch.full((rows, width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = torch.tensor(p), 1
    return ids, mask, (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)


@torch.no_grad()
def step_logits(stepper, ids, mask, pos, tokens) -> list[torch.Tensor]:
    """Prefill, then one step per row of ``tokens [steps, B]``; every step's logits."""
    out = [stepper.prefill(ids, mask, pos)]
    step_pos = pos[:, -1:]
    for t in tokens:
        mask, step_pos = torch.cat([mask, mask.new_ones(len(t), 1)], 1), step_pos + 1
        out.append(stepper.step(t[:, None], step_pos, mask))
    return out
