"""The documented differences from the peers (issue 24, §1), each shown on numbers: the DAPO
all-equal filter vs verl-recipe's ``np.std > 0``, RLOO's group of one vs verl, MIS's weight inside
the band vs TRL's token mask, and the ±20 log-ratio clamp under GSPO vs verl. Each peer rule is
restated here, not imported."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from arlopti.algorithms.advantages import rloo_advantages
from arlopti.plugins.dapo import has_signal
from arlopti.plugins.mismatch import correction_weights
from arlopti.algorithms.policy_loss import gspo_loss


def test_has_signal_drops_an_all_equal_group_that_verl_recipe_keeps_by_rounding():
    rewards = [0.7, 0.7, 0.7]
    verl_keeps = bool(np.std(rewards) > 0)  # recipe/dapo/dapo_ray_trainer.py's filter, restated
    assert verl_keeps and np.std(rewards) == pytest.approx(1.1e-16, rel=0.01)
    assert not bool(has_signal(torch.tensor([rewards], dtype=torch.float64))[0])
    assert bool(has_signal(torch.tensor([[0.0, 1.0, 0.0]]))[0])  # 0/1 rewards: both agree


def test_rloo_group_of_one_is_zero_here_and_its_score_in_verl():
    def verl_rloo(scores, ids):  # compute_rloo_outcome_advantage, restated
        out = []
        for s, g in zip(scores, ids):
            peers = [x for x, h in zip(scores, ids) if h == g]
            n = len(peers)
            out.append(s * n / (n - 1) - sum(peers) / (n - 1) if n > 1 else s)
        return out

    scores, ids = [0.5, 1.0, 0.0], [0, 1, 1]
    ours = rloo_advantages(torch.tensor(scores), torch.tensor(ids)).tolist()
    ref = verl_rloo(scores, ids)
    assert ours[0] == 0.0 and ref[0] == 0.5  # the group of one: the documented difference
    assert ours[1:] == pytest.approx(ref[1:])  # groups of two or more agree


def test_mis_weights_a_kept_token_by_one_where_trl_token_mask_weights_by_the_ratio():
    d = torch.tensor([[math.log(1.5), math.log(0.8), math.log(3.0)]])  # w = 1.5, 0.8, 3
    old, engine, mask = d, torch.zeros_like(d), torch.ones_like(d)
    ours = correction_weights(old, engine, mask, mode="mis", cap=2.0, mis_low=0.5, mis_high=2.0)
    w = torch.exp(d)
    trl = torch.where((w >= 0.5) & (w <= 2.0), w, torch.zeros_like(w))  # token_mask, restated on the same band
    assert ours.tolist() == [[1.0, 1.0, 0.0]]
    torch.testing.assert_close(trl, torch.tensor([[1.5, 0.8, 0.0]]))
    assert torch.equal(ours > 0, trl > 0)  # the same tokens are dropped


def test_gspo_log_ratio_clamp_changes_the_sequence_ratio_beyond_20():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[25.0, -10.0]])  # token log-ratios [25, -10] (values, not probabilities)
    adv, mask = -torch.ones(1, 2), torch.ones(1, 2)
    loss, ind = gspo_loss(logp, old, adv, mask, 3e-4, 4e-4, None)  # configs/algorithm/gspo.yaml
    verl_log_s = min(((25.0 - 10.0) / 2), 10.0)  # compute_policy_loss_gspo, restated: no per-token clamp
    assert ind["ratio"][0, 0].item() == pytest.approx(math.exp(5.0), rel=1e-5)  # 148.4
    assert math.exp(verl_log_s) == pytest.approx(1808.04, rel=1e-5)
    assert loss[0, 0].item() == pytest.approx(148.41, rel=1e-4)  # A = -1: the loss is s_i
    # within ±20 the clamp changes nothing
    loss_in, ind_in = gspo_loss(torch.tensor([[15.0, -10.0]]), old, adv, mask, 3e-4, 4e-4, None)
    assert ind_in["ratio"][0, 0].item() == pytest.approx(math.exp(2.5), rel=1e-5)
