"""Scripted rollouts and small environments for the multi-turn tests (arlopti.rollout.turns).

:class:`ScriptedEngine` is a :class:`~arlopti.rollout.engine.RolloutEngine` whose "model" is a function of
the context it is given (the prompt and the episode so far, as ids) and the response's seed: the tests choose
what each turn says. Its ids spell the text one character at a time (:func:`char_ids`), a tokenization BPE
would never produce, so any decode-and-encode of an earlier turn would show in the trained ids.
"""

from __future__ import annotations

import random

import torch

from arlopti.rollout.engine import Completion, RolloutEngine
from arlopti.rollout.seeds import sample_seed
from arlopti.tasks.env import TextEnv

#: A tool-aware ChatML template written for these tests (Qwen2.5's layout, restated): tools in a system
#: message, tool results as <tool_response> blocks of a user message.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_ids(tok, text: str) -> list[int]:
    """``text`` as one token per character (each character encoded on its own)."""
    return [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]


def turn_number(tok, ids: list[int]) -> int:
    """Model turns before this one in a context: generation headers after the first."""
    return tok.decode(ids, skip_special_tokens=False).count("<|im_start|>assistant") - 1


def bpe_ids(tok, text: str) -> list[int]:
    """``text`` as the tokenizer encodes it (no special token added): what re-tokenization gives back."""
    return list(tok(text, add_special_tokens=False)["input_ids"])


class ScriptedEngine(RolloutEngine):
    """``generate`` answers ``say(tok, context_ids, seed) -> (text, stop)``: the turn's text as ``encode``
    spells it (default :func:`char_ids`), ended by the EOS token unless ``stop`` (then it ends as a stop
    string would, no EOS). Records every call."""

    def __init__(self, tokenizer, say, encode=char_ids):
        super().__init__()
        self.tokenizer, self.say, self.encode = tokenizer, say, encode
        self.calls: list[tuple[list[list[int]], int, object, list]] = []

    def generate(self, prompt_ids, n, sampling, first: int = 0):
        """``first``: the index of ``prompt_ids[0]`` in the call (a rollout worker's share starts there)."""
        tok = self.tokenizer
        out = []
        for i, p in enumerate(prompt_ids):
            row = []
            for j in range(n):
                seed = sample_seed(sampling.seed or 0, first + i, j)
                text, stop = self.say(tok, list(p), seed)
                ids = self.encode(tok, text) + ([] if stop else [tok.eos_token_id])
                reason = "stop"
                if len(ids) > sampling.max_new_tokens:
                    ids, reason = ids[:sampling.max_new_tokens], "length"
                row.append(Completion(ids, tok.decode(ids, skip_special_tokens=True), reason,
                                      [-0.25 - 0.01 * k for k in range(len(ids))] if sampling.logprobs else None))
            out.append(row)
        self.calls.append(([list(p) for p in prompt_ids], n, sampling, out))
        return out


def counting(tok, ctx, seed):
    """Turn k says ``t<k>`` plus a letter from the seed; the third turn says ``done``."""
    k = turn_number(tok, ctx)
    return ("done" if k >= 2 else f"t{k}{random.Random(seed).choice('abc')}"), False


class CountEnv(TextEnv):
    """Replies ``ok <n>`` to every turn (reward 0.25 each) until the model says ``done`` (reward 1)."""

    def reset(self, row):
        self.n = 0
        return None

    def step(self, text):
        self.n += 1
        if "done" in text:
            return None, True, 1.0
        return f"ok {self.n}", False, 0.25


class NullEnv(TextEnv):
    """Never replies: every episode is the single response."""

    def reset(self, row):
        return None

    def step(self, text):
        return None, True, None


class IncrementEnv:
    """TRL's documented environment (docs/source/grpo_trainer.md, "Environments"), as written there."""

    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def eos_prone(model, tok, logit: float = 2.5, text: str | None = None) -> None:
    """Point a random tiny model's EOS output row along its mean final hidden state on ``text`` (default: a chat
    prompt), so that it ends a turn within a few tokens (a random model otherwise runs every turn to its limit)."""
    text = text or tok.apply_chat_template([{"role": "user", "content": "Count 1"}], tokenize=False,
                                           add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        h = model.model(ids).last_hidden_state[0].mean(0)
        model.lm_head.weight[tok.eos_token_id] = h / h.norm() ** 2 * logit
