"""``Episode``: one sampled response as the learner trains on it, whatever produced it.

Every rollout source (:mod:`arlopti.rollout.source`: colocated HF, colocated vLLM, the rollout
workers) returns a step's episodes, grouped by prompt. An episode holds token ids, never text to be
re-encoded: ``token_ids`` is everything after the prompt, in order. In a single-turn episode that
is the sampled response; in a multi-turn one it is the model's sampled turns with the environment's
replies between them, each reply encoded once as the chat template encodes it.

``trainable`` marks, token by token, what the policy sampled (1) and what the environment wrote (0):
the loss, its normaliser, the advantages, AR's ``p_old``, Lopti's split, the KL, the clip fractions,
the entropy, the mismatch buckets and the token methods all read it (it becomes
:attr:`arlopti.learner.experience.Experience.response_mask`). ``logprobs`` are the engine's
log-probs aligned with ``token_ids`` (0.0 on environment tokens), or None when the engine returned
none. ``version`` is the policy version (training steps done) of the weights that generated it, None
for the current weights. ``meta`` carries per-row facts (turns, tool calls, ...) to the metrics.
``prompt_ids`` is the prompt the episode continues when the environment re-rendered it (its tools, a
first message; :mod:`arlopti.rollout.turns`), the same for the G episodes of a prompt; None: the batch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arlopti.rollout.engine import Completion


@dataclass
class Episode:
    token_ids: list[int]
    trainable: list[int]
    text: str  # what the task scores: the decoded response (a multi-turn episode: the model's final turn)
    finish_reason: str  # "stop" | "length" (the last model turn hit its token limit)
    logprobs: list[float] | None = None
    version: int | None = None
    meta: dict = field(default_factory=dict)
    prompt_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if len(self.trainable) != len(self.token_ids):
            raise ValueError(f"an episode's trainable mask has {len(self.trainable)} entries for "
                             f"{len(self.token_ids)} tokens")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"an episode has {len(self.logprobs)} log-probs for {len(self.token_ids)} tokens")

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def sampled_tokens(self) -> int:
        return sum(self.trainable)

    @classmethod
    def of_completion(cls, c: Completion, version: int | None = None) -> "Episode":
        """A single-turn episode: every token of the completion was sampled."""
        return cls(token_ids=list(c.token_ids), trainable=[1] * len(c.token_ids), text=c.text,
                   finish_reason=c.finish_reason, logprobs=None if c.logprobs is None else list(c.logprobs),
                   version=version)


def single_turn(groups: list[list[Completion]], version: int | None = None) -> list[list[Episode]]:
    """The episodes of one generation call's completions (one list per prompt)."""
    return [[Episode.of_completion(c, version) for c in cs] for cs in groups]


__all__ = ["Episode", "single_turn"]
