"""What a training checkpoint holds beyond Lightning's own: the learner's counters, every rank's
RNG states, and the policy's weights without the frozen reference model (rebuilt from the config,
never saved), checked against this policy's names and shapes on load."""

from __future__ import annotations

import logging

from arlopti.utils.rng import gather_rng_states

log = logging.getLogger(__name__)


def learner_state(rollout_step: int, weight_version: int, guard_state: dict, world_size: int,
                  lora_base: dict | None = None) -> dict:
    """``checkpoint["arlopti"]`` (collective when ``world_size > 1``: every rank's RNG state). A LoRA
    checkpoint holds only the adapter: ``lora_base`` names the base model it belongs to.
    ``policy_version``: the version of the saved weights in the staleness bookkeeping
    (:mod:`arlopti.plugins.staleness`: training steps done, = ``rollout_step``), stated explicitly
    so that rollout workers resumed from it stamp their samples consistently."""
    state = {"rollout_step": rollout_step, "policy_version": rollout_step, "weight_version": weight_version,
             **guard_state,
             "world_size": world_size, "rng": gather_rng_states(world_size)}
    if lora_base is not None:
        state["lora_base"] = lora_base
    return state


def saved_policy_version(checkpoint: dict) -> int:
    """The policy version of a checkpoint's weights: its ``policy_version``, or for a checkpoint saved
    before that key existed its ``rollout_step`` (the same number), or 0."""
    extra = checkpoint.get("arlopti", {})
    return int(extra.get("policy_version", extra.get("rollout_step", 0)))


def drop_reference_weights(module, state_dict, prefix, local_metadata) -> None:
    """A ``state_dict`` post-hook: the frozen reference model is never saved."""
    for key in [k for k in state_dict if k.startswith(prefix + "ref.")]:
        del state_dict[key]


def check_policy_keys(state_dict: dict, policy) -> None:
    """Raise :class:`~arlopti.config.ConfigError` if a checkpoint's ``policy.*`` tensors do not match
    this policy's names and shapes."""
    from arlopti.config import ConfigError

    saved = {k[len("policy."):]: v for k, v in state_dict.items() if k.startswith("policy.")}
    own = policy.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = sorted(k for k in set(own) & set(saved)
                    if hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        def head(xs):
            return xs[:5] + ([f"... {len(xs) - 5} more"] if len(xs) > 5 else [])

        raise ConfigError(
            "the checkpoint's policy weights do not fit this model: "
            f"missing {head(missing)}, unexpected {head(unexpected)}, shape mismatch {head(shapes)}. "
            "It was saved from a different model.* config; resume with the model it was trained with.")


def rank_rng_state(rng: list, rank: int, world_size: int):
    """This rank's saved RNG state, or None (with a warning) when the checkpoint was saved by another
    number of ranks."""
    state = rng[rank] if rank < len(rng) and len(rng) == world_size else None
    if rng and state is None:
        log.warning("checkpoint saved by %d ranks, resuming on %d: RNG states are not restored", len(rng), world_size)
    return state


def load_learner_state(checkpoint: dict, policy, guard, rank: int, world_size: int,
                       lora_base: dict | None = None) -> tuple[int, int, object]:
    """Check that ``checkpoint`` fits ``policy`` (its keys; for a LoRA run, ``lora_base``: the base
    model's identity), restore ``guard``, and return ``(rollout_step, weight_version, this rank's
    RNG state or None)``. A checkpoint without ``policy_version`` (saved before it existed) loads as
    before; one whose ``policy_version`` differs from its ``rollout_step`` raises ``ValueError``."""
    from arlopti.models.lora import check_base_identity

    if "state_dict" in checkpoint:  # single-file checkpoints; FSDP2 folders are checked by the DCP loader
        check_policy_keys(checkpoint["state_dict"], policy)
    extra = checkpoint.get("arlopti", {})
    if lora_base is not None:
        check_base_identity(extra.get("lora_base"), lora_base, "resume")
    guard.load_state_dict(extra)
    rng = rank_rng_state(extra.get("rng") or [], rank, world_size)
    step = int(extra.get("rollout_step", 0))
    if saved_policy_version(checkpoint) != step:  # older checkpoints have no policy_version: it is rollout_step
        raise ValueError(f"checkpoint: policy_version={saved_policy_version(checkpoint)} but rollout_step={step}; "
                         "the two are the same count (training steps done), so the checkpoint is corrupt")
    return step, int(extra.get("weight_version", 0)), rng
