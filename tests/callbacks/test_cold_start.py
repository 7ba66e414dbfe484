"""ColdStartCallback: warms up once on a fresh run, re-anchors the reference, bumps the weight
version; not again on a resumed run. The SFT itself is tested in tests/learner/test_cold_start.py."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import torch

from arlopti.callbacks.cold_start import ColdStartCallback
from arlopti.learner.policy import PolicyLM


class Logger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))


def _trainer(logger):
    return SimpleNamespace(global_rank=0, loggers=[logger],
                           precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext))


def test_warm_up_once_then_the_reference_is_the_warmed_up_policy(tiny_tokenizer, tiny_model):
    policy = PolicyLM(tiny_model)
    module = SimpleNamespace(policy=policy, ref=copy.deepcopy(policy), tokenizer=tiny_tokenizer, rollout_step=0,
                             weight_version=0)
    cb = ColdStartCallback(steps=2, batch_size=2, puzzles=4, num_people=[2], lr=1e-3)
    logger = Logger()
    cb.on_fit_start(_trainer(logger), module)
    assert cb.done and len(cb.losses) == 2 and module.cold_start_losses == cb.losses
    assert [step for step, m in logger.calls] == [0, 1] and "cold_start/loss" in logger.calls[0][1]
    assert module.weight_version == 1  # the rollout engine syncs the warmed-up weights
    assert all(torch.equal(a, b) for a, b in zip(module.ref.state_dict().values(), policy.state_dict().values()))
    cb.on_fit_start(_trainer(logger), module)  # done: not again
    assert module.weight_version == 1 and len(logger.calls) == 2
    again = ColdStartCallback(steps=2)
    again.load_state_dict(cb.state_dict())  # restored from a checkpoint
    assert again.done and again.losses == cb.losses


def test_a_resumed_or_disabled_run_does_not_warm_up(tiny_tokenizer, tiny_model):
    module = SimpleNamespace(policy=PolicyLM(tiny_model), ref=None, tokenizer=tiny_tokenizer, rollout_step=3,
                             weight_version=5)
    cb = ColdStartCallback(steps=2)
    cb.on_fit_start(_trainer(Logger()), module)
    assert not cb.done and module.weight_version == 5
    module.rollout_step = 0
    ColdStartCallback(enabled=False).on_fit_start(_trainer(Logger()), module)
    assert module.weight_version == 5
