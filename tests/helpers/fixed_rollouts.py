"""A rollout engine with fixed, varied-length completions, for learner tests that compare two runs.

:class:`FixedEngine` returns, for prompt ``p`` and sample ``j``, token ids drawn from a
``random.Random`` seeded by ``(p's tokens, j)``: the same rollout in every run whatever the
weights, with response lengths spread over ``[min_len, max_new_tokens]`` (the HF engine on a
random tiny model almost always runs to ``max_new_tokens``, which would make every split of a
mini-batch pad alike).
"""

from __future__ import annotations

import hashlib
import random

from arlopti.rollout.engine import Completion, RolloutEngine


class FixedEngine(RolloutEngine):
    def __init__(self, tokenizer, min_len: int = 1):
        super().__init__()
        self.tokenizer = tokenizer
        self.min_len = min_len

    def generate(self, prompt_ids, n, sampling):
        vocab = len(self.tokenizer)
        out = []
        for p in prompt_ids:
            key = hashlib.blake2b(str(list(p)).encode(), digest_size=8).hexdigest()
            comps = []
            for j in range(n):
                rng = random.Random(f"{key}/{j}")
                length = rng.randint(self.min_len, sampling.max_new_tokens)
                ids = [rng.randrange(3, vocab) for _ in range(length)]
                comps.append(Completion(ids, self.tokenizer.decode(ids), "length"))
            out.append(comps)
        return out
