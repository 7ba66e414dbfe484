"""The weight publisher: what a sync sends to an engine or a rollout worker, for both placements.

One decision, made here for the colocated vLLM engine (:class:`arlopti.rollout.vllm.VLLMEngine`) and
the rollout workers (:class:`arlopti.rollout.server_rollouts.ServerRollouts`) alike; how the tensors
travel (vLLM's in-process load, or the gloo transfer) is theirs:

=====================  ===========================================  ====================================
policy                 the receiver does not hold the base yet      it does (an earlier full sync)
=====================  ===========================================  ====================================
full training          ``full``: every parameter                    ``full``: every parameter
LoRA, ``merged``       ``full``: base + merged adapted weights      ``changed``: the merged adapted
                                                                    weights and ``modules_to_save``
                                                                    copies only (the base never moves),
                                                                    with the frozen weights fused with
                                                                    them (``k_proj`` beside ``q_proj``)
LoRA, ``adapter``      ``base``: the frozen base, then the adapter  ``adapter``: the adapter alone
=====================  ===========================================  ====================================

Every plan is checked by name first (:func:`arlopti.rollout.weight_sync.check_names`): the full
list of ``(checkpoint name, tensor)`` pairs the policy maps to must be exactly the names the receiver
was built from, so a wrapper that renamed a parameter, or another model, is an error listing both
kinds of mismatch before anything is sent. The colocated engine was built from the policy itself
(its model directory, :func:`arlopti.rollout.vllm_startup.engine_weight_names`). A rollout worker
was built from the base as loaded (:mod:`arlopti.rollout.serve`, the same base: it proved that at
connect time by its served name), with its LM head untied as the trainer's where the run's LoRA adapts
an embedding the base ties to it (:func:`arlopti.models.lora.untie_adapted_embedding`; the served name
says so, :func:`head_untied_for_lora`, and a worker with the other head is refused at connect time), so
:meth:`WeightPublisher.for_policy` expects the policy's own plain names, ``lm_head.weight`` included
when the head is untied. A ``changed`` plan sends a subset of that checked list. "Holds the base" is
the receiver's state, reset when it restarts or a level-2 sleep drops its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlopti.models.lora import base_model_of, is_lora
from arlopti.rollout.lora_sync import changed_only, engine_named_params
from arlopti.rollout.weight_sync import check_names, named_sync_params, nbytes

KINDS = ("full", "changed", "base", "adapter")


@dataclass
class Publication:
    """One sync's plan: the ``(checkpoint name, tensor)`` pairs to stream (FSDP2 DTensors are gathered
    while streaming) and whether the policy's LoRA adapter is published after them."""

    kind: str
    items: list[tuple[str, Any]]
    adapter: bool

    @property
    def nbytes(self) -> int:
        return sum(nbytes(t) for _, t in self.items)


def tied_embeddings(policy) -> bool:
    """Whether the policy's LM head is its embedding (the receiver ties them itself: the head is not sent)."""
    return bool(getattr(getattr(base_model_of(policy), "config", None), "tie_word_embeddings", False))


def tied_as_loaded(policy) -> bool:
    """Whether the base tied its LM head to its embedding as loaded, which is how a rollout worker loads it:
    the base identity (:func:`arlopti.models.lora.base_identity`, taken before any LoRA untie) records it."""
    identity = getattr(base_model_of(policy), "arlopti_base_identity", None) or {}
    tie = (identity.get("arch") or {}).get("tie_word_embeddings")
    return tied_embeddings(policy) if tie is None else bool(tie)


def head_untied_for_lora(policy) -> bool:
    """Whether the policy's LM head was untied from the embedding it shared as loaded (a LoRA run that adapts
    that embedding): a rollout worker must untie its own too, and says so in its served name."""
    return tied_as_loaded(policy) and not tied_embeddings(policy)


class WeightPublisher:
    """Plans every sync of one receiver kind (module docstring). ``expected_names``: the checkpoint names
    the receiver was built from; ``lora_sync``: ``rollout.lora_sync`` (read only for a LoRA policy);
    ``fused``: the receiver model's ``packed_modules_mapping`` (:func:`arlopti.rollout.lora_sync.changed_only`)."""

    def __init__(self, expected_names: list[str], tie_word_embeddings: bool, lora_sync: str = "merged",
                 where: str = "the vLLM engine (names it was built from)", fused: dict | None = None):
        if lora_sync not in ("merged", "adapter"):
            raise ValueError(f"rollout.lora_sync={lora_sync!r}: use 'merged' or 'adapter'")
        self.expected_names = list(expected_names)
        self.tie = bool(tie_word_embeddings)
        self.lora_sync = lora_sync
        self.where = where
        self.fused = fused  # the receiver's packed_modules_mapping (None: lora_sync.FUSED_IN_ENGINE)

    @classmethod
    def for_policy(cls, policy, lora_sync: str = "merged",
                   where: str = "the rollout workers (the base as they load it)"):
        """The rollout workers' publisher: its expected names are those of the base as a worker builds it
        (the policy's plain names, with the policy's tie: a worker unties its head where the trainer did,
        module docstring), derived as the colocated engine's are; the worker's base and head are the
        trainer's, checked at connect time by the served name."""
        names = [n for n, _ in named_sync_params(engine_named_params(policy, merged=True), tied_embeddings(policy))]
        return cls(names, tied_embeddings(policy), lora_sync, where)

    def adapter_mode(self, policy) -> bool:
        return is_lora(policy) and self.lora_sync == "adapter"

    def plan(self, policy, holds_base: bool) -> Publication:
        """What to send to a receiver that does (or does not yet) hold this run's base weights."""
        adapter = self.adapter_mode(policy)
        items = named_sync_params(engine_named_params(policy, merged=not adapter), self.tie)
        check_names([n for n, _ in items], self.expected_names, where=self.where)
        if adapter:
            return Publication("adapter", [], True) if holds_base else Publication("base", items, True)
        if holds_base and is_lora(policy):
            return Publication("changed", changed_only(items, policy, self.fused), False)
        return Publication("full", items, False)


__all__ = ["KINDS", "Publication", "WeightPublisher", "head_untied_for_lora", "tied_as_loaded", "tied_embeddings"]
