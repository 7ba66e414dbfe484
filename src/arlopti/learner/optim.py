"""The learner's optimizer and LR schedule from ``optim.*`` (:class:`arlopti.config.OptimConfig`)."""

from __future__ import annotations

import functools

import torch

from arlopti.config import LR_SCHEDULES, OptimConfig


def build_optimizer(params, o: OptimConfig):
    """``(optimizer, LambdaLR)``: AdamW or SGD, and the multiplier ``optim.lr_schedule`` names
    (:data:`arlopti.config.LR_SCHEDULES`: ours, or verl's whose first step runs at lr 0). The
    learner steps the scheduler per ``optim.scheduler_interval``."""
    if o.name == "adamw":
        opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(LR_SCHEDULES[o.lr_schedule],
                                                                          warmup=o.warmup_steps))
