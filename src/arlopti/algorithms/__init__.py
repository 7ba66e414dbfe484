"""The paper's core: GRPO, Advantage Reweighting and Lopti, as pure tensor maths (no Lightning, no Hydra).

Read in this order: :mod:`.reweighting` (AR), :mod:`.isolation` (Lopti), :mod:`.plan` (the order of a
rollout step's optimizer steps), :mod:`.inputs` (each token's p_old, advantage and phase), then
:mod:`.objective` (the loss they feed), :mod:`.policy_loss` and :mod:`.aggregation`. The GRPO base:
:mod:`.advantages` (GRPO, Dr.GRPO, RLOO) and :mod:`.kl`.

Registries (``ADVANTAGE_ESTIMATORS``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``, ``LOSS_AGGREGATIONS``) map
config names to functions; each function's docstring states its exact formula and normaliser. The
other methods (rival losses, token methods, mismatch correction, DAPO, …) stand on top in
:mod:`arlopti.plugins`, which registers into the same registries; nothing here imports them.
"""

from arlopti.algorithms.advantages import (broadcast_to_tokens, grpo_advantages, outcome_token_rewards,
                                           rloo_advantages, zero_std_group_fraction)
from arlopti.algorithms.aggregation import LossScale, aggregate, normaliser
from arlopti.algorithms.isolation import Phase, lopti_masks, phase_plan
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.objective import Shaping, grpo_objective
from arlopti.algorithms.policy_loss import Clip, per_token_policy_loss, policy_loss
from arlopti.algorithms.reweighting import advantage_reweight, ar_weights
from arlopti.config.registries import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

__all__ = [
    "ADVANTAGE_ESTIMATORS", "Clip", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "LossScale", "POLICY_LOSSES", "Phase",
    "Shaping", "advantage_reweight", "aggregate", "ar_weights", "broadcast_to_tokens", "grpo_advantages",
    "grpo_objective", "kl_penalty", "lopti_masks", "normaliser", "outcome_token_rewards", "per_token_policy_loss",
    "phase_plan", "policy_loss", "rloo_advantages", "zero_std_group_fraction",
]
