"""The learner's optimizer and LR schedule from ``optim.*`` (:class:`arlopti.config.OptimConfig`)."""

from __future__ import annotations

import functools

import torch

from arlopti.config import OptimConfig


def linear_warmup_multiplier(step: int, warmup: int) -> float:
    """Ours (``optim.lr_schedule=linear_warmup``): ``min(1, (step + 1) / warmup)``, 1 without
    warm-up, so the first scheduler step already runs at a non-zero lr."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def verl_multiplier(step: int, warmup: int) -> float:
    """Official (``optim.lr_schedule=verl``): ``min(1, step / max(1, warmup))``, restating
    ``get_constant_schedule_with_warmup`` in ``verl/utils/torch_functional.py`` of
    zhyang2226/AR-Lopti. With ``warmup = 0`` the multiplier at step 0 is 0: the first update runs
    at lr 0 (Adam's moments and step count still advance)."""
    return min(1.0, step / max(1, warmup))


#: ``optim.lr_schedule`` -> the LR multiplier at scheduler step ``s`` given ``warmup`` steps.
LR_SCHEDULES = {"linear_warmup": linear_warmup_multiplier, "verl": verl_multiplier}


def build_optimizer(params, o: OptimConfig):
    """``(optimizer, LambdaLR)``: AdamW or SGD, and the multiplier ``optim.lr_schedule`` names
    (:data:`LR_SCHEDULES`: ours, or verl's whose first step runs at lr 0). The
    learner steps the scheduler per ``optim.scheduler_interval``."""
    if o.name == "adamw":
        opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(LR_SCHEDULES[o.lr_schedule],
                                                                          warmup=o.warmup_steps))
