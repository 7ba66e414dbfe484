"""The learner's one seam to the options, by hand: what a config asks of the forwards, the loss's count
under the empty-row rule, the rollout correction, and the shaping it hands the core."""

import dataclasses

import pytest
import torch

from arlopti.algorithms import Shaping
from arlopti.config import AlgorithmConfig, RolloutConfig
from arlopti.config.schema import LossParamsConfig, RolloutCorrectionConfig
from arlopti.ops.tile_stats import StatsRequest
from arlopti.plugins.rival_losses import LossExtras
from arlopti.plugins.run_options import RunOptions

MASK = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # the second response is empty


def _options(**algorithm) -> RunOptions:
    return RunOptions(AlgorithmConfig(**algorithm), RolloutConfig())


def test_grpo_asks_for_nothing_and_counts_like_the_core():
    opts = _options()
    assert opts.forward_stats == StatsRequest() and opts.old_pass_stats is None
    assert not opts.needs_old_before_update and opts.empty_rows == "skip"
    assert opts.loss_count(MASK, "token-mean") == 2.0 and opts.loss_count(MASK, "seq-mean-token-mean") == 1.0


def test_what_the_options_ask_of_the_passes():
    assert _options(policy_loss="simko").forward_stats.top_k == LossParamsConfig().simko_top_k
    assert _options(advantage="otb").old_pass_stats == StatsRequest(sum_p2=True)
    assert _options(advantage="otb").needs_old_before_update
    assert _options(kl_in="reward", kl_coef=0.1).needs_old_before_update
    assert not _options(kl_in="reward", kl_coef=0.0).needs_old_before_update


def test_sapos_zero_rows_count_every_row():
    opts = _options(policy_loss="sapo", loss_params=LossParamsConfig(sapo_empty_rows="zero"))
    assert opts.loss_count(MASK, "seq-mean-token-mean") == 2.0  # B, the empty row a zero mean
    assert opts.loss_count(MASK, "token-mean") == 2.0  # token-mean has no rows


def test_no_correction_without_a_mode_and_a_clear_error_without_engine_log_probs():
    sub = type("Sub", (), {"engine_logprobs": None, "response_mask": MASK})()
    assert _options().correction(torch.zeros(2, 3), sub) is None
    opts = _options(rollout_correction=RolloutCorrectionConfig(mode="tis"))
    with pytest.raises(ValueError, match="return_logprobs"):
        opts.correction(torch.zeros(2, 3), sub)


def test_the_shaping_of_plain_grpo_changes_nothing_but_carries_the_losss_settings():
    sub = type("Sub", (), {"engine_logprobs": None, "response_mask": MASK})()
    logp = torch.log(torch.full((2, 3), 0.5))
    s = _options().shaping(logp, logp, torch.ones(2, 3), sub, MASK, None, None)
    assert isinstance(s, Shaping) and s.adv_weight is None and s.loss_weight is None and s.penalties == ()
    assert s.own_count is None and isinstance(s.loss_inputs, LossExtras)
    assert dataclasses.asdict(s.loss_inputs.params) == dataclasses.asdict(LossParamsConfig())
