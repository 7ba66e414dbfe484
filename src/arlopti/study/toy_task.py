"""The study's controlled task: "first half", the toy task of tests/learner/test_learning.py.

The reward of a response is the share of its first 16 characters that are the letters a-m, in
[0, 1] (correct: above 0.5). On the tiny random model (byte-level BPE over K&K sentences, 512
tokens) it starts near 0.29 and a few dozen updates at lr 1e-2 raise it: the policy learns to put
probability on word pieces rich in a-m letters. Prompts are ``"Zoey said {i}."`` for i < n.

Registered as the task ``study_first_half`` (its own name, so that it never shadows the test
file's ``first_half``; the formula is the same).

**The warm start** (the harder variant, ours): from random initialisation every sampled token has
p < .25 (a 491-token vocabulary at T = 1: p ≈ 1/491), so every token sits in the lowest bucket,
Lopti's high phase is empty and AR is GRPO at 0.7x the learning rate; the question cannot be asked.
:func:`warm_start` first fits the model for a few SFT steps to K&K-like sentences
``" <name> is a <role>."`` (a K&K name, knight or knave) after each prompt. The structure tokens
(" is", " a", the role) then sit in the top buckets and the names (pieces of a 53-name list, many
split into bytes) in the low ones, as in an instruct model (measured by the study). Sentences of
the list score 0.375-0.5625; more needs tokens off the warm start's support.
"""

from __future__ import annotations

from arlopti.data.prompt_datamodule import PromptDataModule
from arlopti.prompts.records import PromptRecord
from arlopti.tasks.base import RewardResult, Task, register_task

TASK_NAME = "study_first_half"
#: Characters of the response that are scored.
SCORED_CHARS = 16


@register_task(TASK_NAME)
class FirstHalfTask(Task):
    """Reward: the share of the first 16 characters that are the letters a-m (module docstring)."""

    name = TASK_NAME

    def score(self, responses, ground_truths, metas):
        out = []
        for text in responses:
            value = sum("a" <= c <= "m" for c in text[:SCORED_CHARS]) / SCORED_CHARS
            out.append(RewardResult(value, value > 0.5))
        return out


class FirstHalfData(PromptDataModule):
    """``n`` prompts ``"Zoey said {i}."`` of the task above; no validation sets."""

    task_name = TASK_NAME

    def __init__(self, n: int = 256, **kw):
        super().__init__(**kw)
        self.n = n

    def train_records(self):
        return [PromptRecord(uid=f"{TASK_NAME}/{i}", ground_truth=None, task=TASK_NAME, text=f"Zoey said {i}.")
                for i in range(self.n)]


# ------------------------------------------------------------------------------------------ the warm start
#: The warm start's targets: "<name> is a <role>." with a K&K name and role (module docstring).
ROLES = ("knight", "knave")


def warm_start_examples(tokenizer, n: int = 256, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, target ids + EOS)`` for the prompts ``"Zoey said {i}."``, i < n: the target is
    ``" <name> is a <role>."``, the name and role drawn with ``random.Random(seed)`` (the same data for
    every run)."""
    import random

    from arlopti.tasks.kk.render import NAMES

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = tokenizer(f"Zoey said {i}.", add_special_tokens=False)["input_ids"]
        target = f" {rng.choice(NAMES)} is a {rng.choice(ROLES)}."
        out.append((prompt, tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]))
    return out


def warm_start(policy, tokenizer, steps: int, lr: float, seed: int, batch_size: int = 16) -> list[float]:
    """``steps`` SFT steps on :func:`warm_start_examples` (AdamW at ``lr``, no weight decay, the
    token-mean NLL of :func:`arlopti.learner.cold_start.sft_loss`), batches drawn with
    ``random.Random(seed)``; the policy is changed in place, the losses returned."""
    import random

    import torch

    from arlopti.learner.cold_start import sft_loss

    examples = warm_start_examples(tokenizer)
    rng = random.Random(seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    was = policy.training
    policy.train()
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = sft_loss(policy, rng.sample(examples, batch_size), tokenizer.pad_token_id)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    policy.train(was)
    return losses
