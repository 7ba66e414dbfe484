"""What a configured method needs from the learner's forward passes, decided in one place.

The fused log-prob pass (:func:`arlopti.ops.logprobs.token_logprobs`) computes full-distribution
statistics only when asked (:class:`arlopti.ops.tile_stats.StatsRequest`); these functions say, from
the run's :class:`arlopti.config.AlgorithmConfig`, what to ask for:

* the training forward (:func:`forward_stats`): SimKO's top-K log-probs (``policy_loss=simko``, K =
  ``loss_params.simko_top_k``); Lp-Reg's min-p proxy (``token_method.name=lp_reg``, threshold
  κ·p_max at T = 1, i.e. ``log κ / T`` on the tempered logits, as Lp-Reg filters the raw logits);
* the old-log-prob pass (:func:`old_pass_stats`): OTB's Σ π_old² (``advantage=otb``);
* whether the advantages need every token's logπ_old before the first backward
  (:func:`needs_old_before_update`: KL folded into the reward, OTB), which rules out taking the
  first optimizer step's logπ_old from its own forward (:class:`arlopti.algorithms.inputs.FirstStepInputs`).

Every other configuration asks for nothing, so its passes are exactly what they were.
"""

from __future__ import annotations

import math

from arlopti.config import AlgorithmConfig
from arlopti.ops.tile_stats import StatsRequest


def forward_stats(a: AlgorithmConfig, temperature: float) -> StatsRequest:
    """The statistics the training forward must return for ``a`` (module docstring); empty for most."""
    top_k = a.loss_params.simko_top_k if a.policy_loss == "simko" else 0
    min_p = math.log(a.token_method.lp_reg_min_p) / temperature if a.token_method.name == "lp_reg" else None
    return StatsRequest(top_k=top_k, min_p_log=min_p)


def old_pass_stats(a: AlgorithmConfig) -> StatsRequest | None:
    """The statistics of π_old the advantages read (OTB: Σ p²), or None."""
    return StatsRequest(sum_p2=True) if a.advantage == "otb" else None


def needs_old_before_update(a: AlgorithmConfig) -> bool:
    """Whether the advantages read every token's logπ_old before any backward (module docstring)."""
    return (a.kl_in == "reward" and a.kl_coef > 0) or old_pass_stats(a) is not None
