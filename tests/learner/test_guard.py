"""The non-finite guard's aborts name their cause and say whether the weights may be saved (issue 42).

``optim.lr=1e30`` warned at the first step, then ran on with finite weights near 1e29 whose forward
overflows: ``kl nan``, then the diagnostics callback died on an index error and nothing was saved.
Now a NaN in the policy's own log-probs stops the run before the step's update, naming the first
step's warning as the cause, and the checkpoint callback saves the last finite weights and names the
file in the same line. The train.py run of the issue is in tests/test_clear_failures.py; the guard's
older checks (poisoned weights, the first step's size) in test_poisoned_weights.py.
"""

from __future__ import annotations

import re

import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.callbacks.diagnostics import TokenDiagnosticsCallback
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.guard import NonFiniteAbort, NonFiniteGuard
from arlopti.learner.module import GRPOModule
from helpers.fixed_rollouts import FixedEngine
from helpers.toy import ToyDataModule, toy_trainer


def _warned_guard() -> NonFiniteGuard:
    """A guard whose first-step check warned (AdamW at lr 1e30 on one weight of norm 5)."""
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    w.grad = torch.tensor([1.0, 1.0])
    guard = NonFiniteGuard(max_consecutive=2)
    assert guard.check_first_step(torch.optim.AdamW([w], lr=1e30), rollout_step=0) is not None
    return guard


def test_an_abort_names_the_first_steps_warning_as_its_cause():
    guard = _warned_guard()
    assert guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=3) is False
    with pytest.raises(NonFiniteAbort) as caught:
        guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=3)
    msg = str(caught.value)
    assert re.search(r"2 consecutive optimizer steps .* at rollout step 3 \(cause: optim\.lr=1e\+30: the first "
                     r"optimizer step moved the weights by [\d.e+]+ x their own norm\)\. Lower optim\.lr", msg), msg
    assert NonFiniteGuard(2).cause is None  # no warning, no cause
    with pytest.raises(NonFiniteAbort) as caught:
        guard.check_weights(False, rollout_step=4, lr=1e30, loss=0.1, grad_norm=1.0)
    assert "(cause: optim.lr=1e+30" in str(caught.value) and not caught.value.clean


def test_an_abort_is_clean_only_when_no_optimizer_step_of_its_rollout_step_was_taken():
    guard = NonFiniteGuard(max_consecutive=2)
    assert guard.allow(True, loss=0.1, grad_norm=1.0, rollout_step=0)
    guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=1)
    with pytest.raises(NonFiniteAbort) as caught:  # both steps of rollout step 1 skipped: its start's weights
        guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=1)
    assert caught.value.clean
    guard = NonFiniteGuard(max_consecutive=2)
    assert guard.allow(True, loss=0.1, grad_norm=1.0, rollout_step=1)  # one phase stepped, then two skips
    guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=1)
    with pytest.raises(NonFiniteAbort) as caught:
        guard.allow(False, loss=float("nan"), grad_norm=1.0, rollout_step=1)
    assert not caught.value.clean


def test_nan_log_probs_stop_at_once_and_the_note_joins_the_line():
    guard = _warned_guard()
    guard.check_log_probs(True, rollout_step=2)
    with pytest.raises(NonFiniteAbort) as caught:
        guard.check_log_probs(False, rollout_step=2)
    err = caught.value
    assert err.clean and str(err).startswith("the policy's log-probs of its own samples are NaN after 2 rollout "
                                             "steps although its weights are finite: they have diverged (cause: "
                                             "optim.lr=1e+30")
    assert "lower optim.lr" in str(err)
    err.checkpoint_note = "Saved in x.ckpt."
    assert str(err).endswith("start the run again. Saved in x.ckpt.") and "\n" not in str(err)


def test_a_diverged_policy_stops_before_its_update_and_its_last_finite_weights_are_saved(tiny_tokenizer, tmp_path):
    """Weights x 1e15: finite, but the forward overflows (NaN logits). Before: the step ran on (NaN loss,
    skipped) and the diagnostics callback died on the NaN's int64 bin index; nothing was saved."""
    cfg = RunConfig(algorithm=AlgorithmConfig(),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=3)
    module.rollout_engine = FixedEngine(tiny_tokenizer)  # sampling from NaN logits would fail first
    with torch.no_grad():
        for p in module.policy.parameters():
            p.mul_(1e15)
    huge = {k: v.clone() for k, v in module.policy.state_dict().items()}
    assert all(bool(v.isfinite().all()) for v in huge.values())
    ckpt = RolloutCheckpoint(str(tmp_path / "checkpoints"), every_n_steps=10)
    trainer = toy_trainer(callbacks=[TokenDiagnosticsCallback(every_n_steps=1), ckpt], enable_checkpointing=True)
    dm = ToyDataModule(n=8, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    with pytest.raises(NonFiniteAbort) as caught:
        trainer.fit(module, datamodule=dm)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert str(caught.value) == (
        "the policy's log-probs of its own samples are NaN after 0 rollout steps although its weights are finite: "
        "they have diverged. The run stops before this step's update; lower optim.lr (or set optim.grad_clip) and "
        f"start the run again. The last finite weights (after rollout step 0) are saved in {last}.")
    assert module.guard.total == 0 and trainer.global_step == 0  # nothing skipped, nothing stepped
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["arlopti"]["rollout_step"] == 0
    for k, v in huge.items():
        assert torch.equal(saved["state_dict"][f"policy.{k}"], v), k
