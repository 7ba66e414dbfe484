"""Each config rule is stated once (issue 25): the config and the code that needs the same rule call
one function, and the choices of a setting come from the table or registry they describe.

A rule written twice fails here: a second copy of the MIS bound would not see the stub patched
into :func:`arlopti.config.rules.check_mis_bounds`; a second copy of a message shows in the
source scan.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from arlopti.plugins import mismatch
from arlopti.config.registries import ROLLOUT_CORRECTIONS
from arlopti.config import (AlgorithmConfig, ConfigError, RolloutConfig, RolloutCorrectionConfig, RunConfig,
                            field_choices, rules, validate_run)

SRC = Path(__file__).resolve().parents[2] / "src" / "arlopti"


def _mis_run(low: float, high: float) -> RunConfig:
    rc = RolloutCorrectionConfig(mode="mis", mis_low=low, mis_high=high)
    return RunConfig(algorithm=AlgorithmConfig(rollout_correction=rc), rollout=RolloutConfig(return_logprobs=True))


def _mis_weights(low: float, high: float) -> torch.Tensor:
    x = torch.zeros(1, 2)  # w = 1 on both tokens
    return mismatch.correction_weights(x, x, torch.ones_like(x), "mis", 2.0, low, high)


def _field(cls: type, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def test_the_mis_bounds_come_from_one_function_for_the_config_and_the_algorithm(monkeypatch):
    with pytest.raises(ConfigError) as from_config:
        validate_run(_mis_run(1.0, 1.0))
    with pytest.raises(ConfigError) as from_algorithm:
        _mis_weights(1.0, 1.0)
    assert str(from_config.value) == str(from_algorithm.value)  # one message: one source

    seen = []
    monkeypatch.setattr(rules, "check_mis_bounds", lambda low, high: seen.append((low, high)))
    validate_run(_mis_run(1.0, 1.0))  # with the rule stubbed out, neither path refuses the band
    assert _mis_weights(1.0, 1.0).tolist() == [[1.0, 1.0]]
    assert seen == [(1.0, 1.0), (1.0, 1.0)]


@pytest.mark.parametrize("low, high", [(0.5, 0.5), (2.0, 0.5)])
def test_an_empty_mis_band_is_refused_the_same_way_on_both_paths(low, high):
    for refuse in (lambda: validate_run(_mis_run(low, high)), lambda: _mis_weights(low, high)):
        with pytest.raises(ConfigError, match=rf"mis_low={low} must be >= 0 and below mis_high={high}"):
            refuse()


def test_the_algorithm_checks_its_values_with_the_schemas_own_choices_and_ranges(monkeypatch):
    """correction_weights' mode / cap guard is the schema's field check, not a restatement."""
    with pytest.raises(ConfigError) as e:
        _mis_weights(-1.0, 2.0)
    with pytest.raises(ConfigError) as schema:
        validate_run(_mis_run(-1.0, 2.0))
    assert str(e.value) == str(schema.value) == "algorithm.rollout_correction.mis_low=-1.0 must be >= 0"


def test_choices_are_read_from_the_tables_they_describe():
    from arlopti.rollout.hf import DECODERS

    assert field_choices(_field(RolloutConfig, "hf_decoder")) == DECODERS
    modes = field_choices(_field(RolloutCorrectionConfig, "mode"))  # "auto" (issue 27), then the registry's
    assert list(modes) == ["auto", *ROLLOUT_CORRECTIONS.notes()] and sorted(list(modes)[1:]) == ROLLOUT_CORRECTIONS.names()


# each rule's or choice note's wording, and the one file under src/arlopti that may hold it
STATED_ONCE = {
    "must be >= 0 and below mis_high": "config/rules.py",
    "needs the engine's log-probs": "config/rules.py",
    "no dual-clip; set algorithm.dual_clip=null": "config/rules.py",
    "(offload weights)": None,  # the vLLM engine re-checked rollout.sleep_level: the schema does
    "must lie in (0, 1]": None,  # ... and rollout.gpu_memory_utilization
    "step over a preallocated KV cache": "rollout/hf.py",
    "token masking (IcePop): tokens with w_t outside": "plugins/mismatch.py",
    "def linear_warmup_multiplier": "learner/optim.py",
    "every response would be penalised": "config/rules.py",
}


def test_the_overlong_buffer_rule_is_one_for_the_config_and_the_algorithm():
    """Config and dapo.overlong_penalty once disagreed (the config refused buffer == max_new_tokens,
    the algorithm and verl accept it); now both call rules.check_overlong_buffer."""
    from arlopti.plugins.dapo import overlong_penalty
    from arlopti.config import DapoConfig

    def run(buffer: int) -> RunConfig:
        return RunConfig(algorithm=AlgorithmConfig(dapo=DapoConfig(overlong_buffer=buffer)),
                         rollout=RolloutConfig(max_new_tokens=16))

    assert overlong_penalty(torch.tensor([0, 5, 10]), 10, 10).tolist() == [0.0, -0.5, -1.0]
    validate_run(run(16))  # equal is allowed on both paths
    for refuse in (lambda: validate_run(run(17)), lambda: overlong_penalty(torch.tensor([3]), 16, 17)):
        with pytest.raises(ConfigError, match="overlong_buffer=17 exceeds rollout.max_new_tokens=16"):
            refuse()


@pytest.mark.parametrize("phrase", sorted(STATED_ONCE))
def test_a_rule_is_written_in_one_file(phrase):
    holders = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if phrase in p.read_text())
    home = STATED_ONCE[phrase]
    assert holders == ([home] if home else []), f"{phrase!r} is stated in {holders}; state it once"


def test_the_learner_calls_the_configs_return_logprobs_rule():
    import arlopti.plugins.run_options as module  # the learner reaches the correction through this seam

    assert module.check_rollout_correction_logprobs is rules.check_rollout_correction_logprobs
    with pytest.raises(ConfigError, match="mode=tis needs the engine's log-probs: set rollout.return_logprobs=true"):
        rules.check_rollout_correction_logprobs("tis", False)
    rules.check_rollout_correction_logprobs("none", False)


def test_the_lr_schedules_the_schema_offers_are_the_learners():
    """The schedule maths live with their only user (learner/optim.py); the schema keeps the names
    with their notes for the docs, so this ties the two lists."""
    from arlopti.config import OptimConfig
    from arlopti.learner.optim import LR_SCHEDULES

    assert set(field_choices(_field(OptimConfig, "lr_schedule"))) == set(LR_SCHEDULES)
