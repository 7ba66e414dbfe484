"""The OmegaConf resolvers the configs use, registered by :func:`register_resolvers` (on import of
:mod:`arlopti.config`): ``run_label`` (:mod:`arlopti.config.run_name`) and ``share_of``.

``${share_of:N,F}``: ``int(N · F)``, e.g. DAPO's overlong buffer as a share of the response limit,
``overlong_buffer: ${share_of:${rollout.max_new_tokens},0.2}`` (4,096 → 819; the 16-token smoke
run → 3).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def share_of(total, fraction) -> int:
    return int(int(total) * float(fraction))


def register_resolvers() -> None:
    """Register ``run_label`` and ``share_of`` once (idempotent)."""
    from arlopti.config.run_name import run_label

    for name, fn in (("run_label", run_label), ("share_of", share_of)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
