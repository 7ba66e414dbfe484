"""OmegaConf resolvers the configs use besides ``run_label`` (:mod:`arlopti.run_name`).

``${share_of:N,F}``: ``int(N · F)``, e.g. DAPO's overlong buffer as a share of the response limit,
``overlong_buffer: ${share_of:${rollout.max_new_tokens},0.2}`` (4,096 → 819; the 16-token smoke
run → 3). Importing :mod:`arlopti` registers it.
"""

from __future__ import annotations

from omegaconf import OmegaConf


def share_of(total, fraction) -> int:
    return int(int(total) * float(fraction))


def register() -> None:
    if not OmegaConf.has_resolver("share_of"):
        OmegaConf.register_new_resolver("share_of", share_of)


register()
