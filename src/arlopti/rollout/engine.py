"""The rollout-engine interface shared by the HF ``generate`` and vLLM backends.

An engine turns prompt token ids into ``n`` completions per prompt. It also owns a copy of
the policy's weights (the HF engine shares the module itself; vLLM holds its own copy) and
a ``weight_version`` that the learner bumps after every optimizer step: an engine syncs
whenever the policy's version differs from the one it last loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample. ``temperature == 0`` means greedy. ``top_k <= 0`` disables top-k."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    # Base seed of this request; sample j of prompt i uses a seed derived from (seed, i, j).
    seed: int | None = None
    # Return the engine's own log-probs of the sampled tokens (tempered, "processed" mode).
    logprobs: bool = False


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length" (hit max_new_tokens)
    logprobs: list[float] | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class EngineStats:
    syncs: int = 0
    last_sync_seconds: float = 0.0
    generated_tokens: int = 0
    extra: dict = field(default_factory=dict)


class RolloutEngine(ABC):
    """``generate(prompt_ids, n, sampling) -> [[Completion] * n] * len(prompt_ids)``."""

    def __init__(self) -> None:
        self.loaded_version = -1
        self.stats = EngineStats()

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        ...

    def sync_weights(self, policy, version: int) -> bool:
        """Load ``policy``'s weights if ``version`` is newer than what the engine holds.

        Returns True when a sync happened. Engines that share the policy module (HF) only
        record the version.
        """
        if version == self.loaded_version:
            return False
        self._load_weights(policy)
        self.loaded_version = version
        self.stats.syncs += 1
        return True

    def _load_weights(self, policy) -> None:  # HF engine: nothing to copy
        return None

    def wake_and_sync(self, policy, version: int) -> bool:
        """:meth:`wake`, then :meth:`sync_weights`; returns whether a sync happened. The vLLM engine
        wakes in stages instead (its weights, the sync, its KV cache)."""
        self.wake()
        return self.sync_weights(policy, version)

    def sleep(self) -> None:
        """Release accelerator memory during the update (vLLM sleep mode)."""

    def wake(self) -> None:
        """Re-acquire memory before a rollout. A level-2 sleep forgets the weights."""

    def close(self) -> None:
        """Free the engine."""
