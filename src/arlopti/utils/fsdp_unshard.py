"""Hold FSDP2-sharded modules unsharded while the HF engine generates with them.

Generation calls the HF model layer by layer for every new token; with FSDP2 each call would
all-gather and free the layer again. :func:`unsharded_for_generate` gathers every FSDP2 module once
for the whole call and restores the training setting afterwards. It lives below both the learner
(which shards the policy, learner/sharding.py) and the rollout (which generates, rollout/hf.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


def _fsdp_modules(root: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def unsharded_for_generate(root: nn.Module) -> Iterator[None]:
    """Hold every FSDP2 module under ``root`` unsharded for the ``with`` body; no-op otherwise.

    Entering and leaving are collective (every rank must enter, in the same order); the body
    runs no collective, so ranks may generate for different numbers of prompts. Memory: the
    full model in the param dtype on every rank for the length of the call.
    """
    modules = _fsdp_modules(root)
    if not modules:
        yield
        return
    # The root must initialise FSDP's lazy state before a layer runs forward on its own
    # (generate calls the HF model, not the PolicyLM root), or that layer would claim to be root.
    modules[0]._get_fsdp_state()._lazy_init()  # modules[0]: the outermost (pre-order)
    # Private FSDP2 state, read defensively (its layout moved between torch 2.6 and 2.13): what
    # set_reshard_after_forward overwrites, so that training's setting comes back afterwards.
    saved = [([g.post_forward_mesh_info for g in _param_groups(m)],
              getattr(m._get_fsdp_state(), "_auto_reshard_after_forward", None)) for m in modules]
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
    for m in modules:
        m.unshard()
    try:
        yield
    finally:
        for m, (infos, was_auto) in zip(modules, saved):
            m.reshard()
            for g, info in zip(_param_groups(m), infos):
                g.post_forward_mesh_info = info
            if was_auto is not None:
                m._get_fsdp_state()._auto_reshard_after_forward = was_auto


def _param_groups(module: nn.Module) -> list:
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch < 2.10: one group per module
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)
