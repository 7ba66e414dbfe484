"""The OmegaConf resolvers the configs use, registered by :func:`register_resolvers` (on import of
:mod:`arlopti.config`): ``run_label`` (:mod:`arlopti.config.run_name`), ``share_of``, ``exclusive_dir``
(a run folder of its own, :mod:`arlopti.config.run_dir`; cached, so resolved once per config),
``task_log_suffix`` (a submitit task's own log file, same module), ``work_root`` (the project the user
works in, where runs go: same module) and
``job_urls`` (rollout-worker URLs from the job's nodes, :mod:`arlopti.config.job_hosts`).

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
    """Register the resolvers of the module docstring once (idempotent)."""
    from arlopti.config.job_hosts import job_urls
    from arlopti.config.run_dir import claim_dir, task_log_suffix, work_root
    from arlopti.config.run_name import run_label

    for name, fn, cached in (("run_label", run_label, False), ("share_of", share_of, False),
                             ("custom_task", custom_task_options, False),
                             ("exclusive_dir", claim_dir, True), ("job_urls", job_urls, False),
                             ("task_log_suffix", task_log_suffix, False), ("work_root", work_root, False)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cached)
