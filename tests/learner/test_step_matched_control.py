"""The step-matched control of Lopti (issue 51, ``algorithm=grpo_two_steps`` / ``ar_two_steps``), by hand on the
tiny model: exactly Lopti's optimizer steps (the same number, the same mini-batch order, the same optimizer and
the same normaliser per step), every valid token in every step."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from arlopti.config import AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from arlopti.study.methods import flatten, method_algorithm
from helpers.toy import ToyDataModule, toy_trainer

ETA = 0.002  # a random model puts p_old near 1/vocab on every token: this eta splits them in two


def fit(algo: AlgorithmConfig, tok) -> GRPOModule:
    """One rollout step of 2 prompts x 4 responses in mini-batches of 4 (micro-batches of 2)."""
    sizes = SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                        logprob_micro_batch_size=8)
    cfg = RunConfig(algorithm=algo, sizes=sizes, optim=OptimConfig(lr=1e-2),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=12))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    toy_trainer().fit(module, datamodule=ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256))
    return module


def test_the_control_is_lopti_without_the_split_and_nothing_else():
    """The composed configs differ from Lopti's / AR + Lopti's at the split (lopti.enabled) and the second
    pass (ppo_epochs: Lopti makes two passes as two phases, the control as two epochs of one phase)."""
    for control, method in (("grpo_two_steps", "lopti"), ("ar_two_steps", "ar_lopti")):
        a, b = flatten(asdict(method_algorithm(control, 8))), flatten(asdict(method_algorithm(method, 8)))
        assert {k for k in a if a[k] != b[k]} == {"lopti.enabled", "ppo_epochs"}, control
        assert (a["ppo_epochs"], a["lopti.enabled"], b["ppo_epochs"], b["lopti.granularity"]) == (2, False, 1, "batch")


def _record(monkeypatch):
    """Every optimizer step's (phase, rows, tokens trained, valid tokens, normaliser), in order."""
    import arlopti.learner.module as mod

    steps, scales = [], []
    real_scale, real_accumulate = mod.GRPOModule._loss_count, mod.GRPOModule._accumulate
    real_objective = mod.grpo_objective

    def scale(self, exp, phase, rows, t):
        scales.append(real_scale(self, exp, phase, rows, t))
        return scales[-1]

    def accumulate(self, exp, phase, rows, micros, t, metrics, prefixes):
        steps.append({"phase": phase, "rows": list(rows), "trained": 0.0, "valid": 0.0})
        return real_accumulate(self, exp, phase, rows, micros, t, metrics, prefixes)

    def objective(logp, old, adv, mask, pmask, *a, **k):
        steps[-1]["trained"] += float(pmask.float().sum())
        steps[-1]["valid"] += float(mask.sum())
        return real_objective(logp, old, adv, mask, pmask, *a, **k)

    monkeypatch.setattr(mod.GRPOModule, "_loss_count", scale)
    monkeypatch.setattr(mod.GRPOModule, "_accumulate", accumulate)
    monkeypatch.setattr(mod, "grpo_objective", objective)
    return steps, scales


@pytest.mark.parametrize("ar_alpha", [0.0, 0.3], ids=["grpo_two_steps", "ar_two_steps"])
def test_the_control_takes_lopti_s_steps_over_every_token(ar_alpha, tiny_tokenizer, monkeypatch):
    runs = {}
    for name, algo in (("lopti", AlgorithmConfig(ar_alpha=ar_alpha, lopti=LoptiConfig(enabled=True, eta=ETA))),
                       ("control", AlgorithmConfig(ar_alpha=ar_alpha, ppo_epochs=2))):
        steps, scales = _record(monkeypatch)
        module = fit(algo, tiny_tokenizer)  # 8 responses, mini-batches of 4: rows 0-3, 4-7
        runs[name] = (steps, scales, module.trainer.global_step)
        monkeypatch.undo()
    (lopti, lopti_scales, lopti_n), (ctrl, ctrl_scales, ctrl_n) = runs["lopti"], runs["control"]
    assert lopti_n == ctrl_n == 4 and len(lopti) == len(ctrl) == 4  # two passes x two mini-batches, each a step
    assert [s["rows"] for s in ctrl] == [s["rows"] for s in lopti] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    assert [s["phase"] for s in lopti] == ["low", "low", "high", "high"] and {s["phase"] for s in ctrl} == {"all"}
    assert all(s["trained"] == s["valid"] > 0 for s in ctrl)  # every valid token, in both passes
    assert all(0 < s["trained"] < s["valid"] for s in lopti)  # Lopti's split at this eta: part of them
    # the normaliser: each step divides by its mini-batch's valid tokens, the same number under both
    assert ctrl_scales == lopti_scales and [s["valid"] for s in ctrl] == [s["valid"] for s in lopti] == ctrl_scales
