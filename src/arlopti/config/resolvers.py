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


#: The ``task`` node's keys only the environment reads (:class:`arlopti.config.schema.EnvConfig`; it
#: shares ``max_error_frac`` and ``error_window`` with ``task=custom``).
ENV_ONLY_KEYS = ("env", "env_timeout_s", "tool_format")


def custom_task_options(node):
    """``${custom_task:${oc.select:task,null}}``: ``task=custom``'s options, the run's ``task`` node without
    the environment's own keys, or None when the node holds no reward function key (``task=custom`` is
    not chosen: the node is then only ``configs/train.yaml``'s environment keys)."""
    if node is None:
        return None
    options = {k: v for k, v in dict(node).items() if k not in ENV_ONLY_KEYS}
    return OmegaConf.create(options) if "reward_fn" in options or "reward_fns" in options else None


def register_resolvers() -> None:
    """Register ``run_label`` and ``share_of`` once (idempotent)."""
    from arlopti.config.run_name import run_label

    for name, fn in (("run_label", run_label), ("share_of", share_of), ("custom_task", custom_task_options)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
