"""How often a callback acts: one check of its ``every_n_steps``-style settings and one rule for "now".

Every callback with a cadence (checkpointing, evals, diagnostics, rollout dumps, the step line)
takes a positive int, or null for "never" where it allows it; anything else is a ``ValueError``
naming the key, in the same words everywhere.
"""

from __future__ import annotations


def check_every(key: str, value, allow_none: bool = True) -> int | None:
    """``value`` when it is an int >= 1 (or None where ``allow_none``); else a ``ValueError`` naming ``key``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: use an integer >= 1" + (" or null" if allow_none else ""))
    return value


def due(every: int | None, step: int) -> bool:
    """Whether a cadence of ``every`` rollout steps acts at rollout step ``step`` (never when None)."""
    return every is not None and step % every == 0


__all__ = ["check_every", "due"]
