"""Pure tensor maths of GRPO + AR + Lopti. No Lightning, no Hydra.

Registries (``ADVANTAGE_ESTIMATORS``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``, ``LOSS_AGGREGATIONS``,
``ROLLOUT_CORRECTIONS``) map config names to functions; each function's docstring states its exact
formula and normaliser. Composition: an estimator makes the token advantages; AR reweights them;
Lopti's phase masks them; the policy loss turns them into a per-token loss, times the
rollout-correction weight; the aggregation reduces it (:mod:`.objective`). The low-probability-token
rivals register their losses from :mod:`.rival_losses`, Lp-Reg in :mod:`.token_methods`, OTB in
:mod:`.advantages`; :mod:`.forward_needs` says which full-distribution statistics a config needs.

Read first: :mod:`.reweighting` (AR) and :mod:`.isolation` (Lopti), then :mod:`.plan` (a step's passes)
and :mod:`.objective` (the loss they feed).
"""

from arlopti.algorithms.advantages import (broadcast_to_tokens, grpo_advantages, masked_whiten,
                                           outcome_token_rewards, reinforce_pp_advantages,
                                           reinforce_pp_baseline_advantages, rloo_advantages, zero_std_group_fraction)
from arlopti.algorithms.aggregation import aggregate, normaliser
from arlopti.algorithms.isolation import Phase, lopti_masks, phase_plan
from arlopti.algorithms.kl import kl_penalty
from arlopti.algorithms.objective import LossConfig, grpo_objective
from arlopti.algorithms.policy_loss import per_token_policy_loss, policy_loss
from arlopti.algorithms import rival_losses  # noqa: F401  (registers DPPO-TV/KL, SAPO, CE-GPPO, ASPO, SimKO)
from arlopti.config.registries import (ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES,
                                         ROLLOUT_CORRECTIONS)
from arlopti.algorithms.reweighting import advantage_reweight, ar_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "LossConfig", "POLICY_LOSSES", "Phase",
    "ROLLOUT_CORRECTIONS", "masked_whiten", "outcome_token_rewards", "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "advantage_reweight", "aggregate", "ar_weights", "broadcast_to_tokens", "grpo_advantages",
    "grpo_objective", "kl_penalty", "lopti_masks", "normaliser", "per_token_policy_loss", "phase_plan",
    "policy_loss", "rloo_advantages", "zero_std_group_fraction",
]
