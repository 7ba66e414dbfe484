"""What a training checkpoint holds beyond Lightning's own: the learner's counters, every rank's
RNG states, and the policy's weights without the frozen reference model (rebuilt from the config,
never saved), checked against this policy's names and shapes on load."""

from __future__ import annotations

from arlopti.utils.rng import gather_rng_states


def learner_state(rollout_step: int, weight_version: int, guard_state: dict, world_size: int) -> dict:
    """``checkpoint["arlopti"]`` (collective when ``world_size > 1``: every rank's RNG state)."""
    return {"rollout_step": rollout_step, "weight_version": weight_version, **guard_state,
            "world_size": world_size, "rng": gather_rng_states(world_size)}


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
    """This rank's saved RNG state, or None when the checkpoint was saved by another number of ranks."""
    return rng[rank] if rank < len(rng) and len(rng) == world_size else None
