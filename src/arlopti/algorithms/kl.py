"""Per-token KL estimators between the policy and the frozen reference (Schulman's k1/k2/k3).

With d = ref_log_probs − log_probs (per sampled token):

* ``k1``          log π − log π_ref = −d
* ``k2``          ½ d²
* ``k3``          e^d − d − 1  (unbiased, non-negative)
* ``low_var_kl``  k3 with d clamped to [−5, 5] and the result clamped to [−10, 10]
                  (the official code's ``low_var_kl``)

Returns ``[B, T]``; masking and aggregation are the caller's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arlopti.config.registries import KL_ESTIMATORS


@KL_ESTIMATORS.register("k1")
def _k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def _k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    return 0.5 * (ref_log_probs - log_probs).square()


@KL_ESTIMATORS.register("k3")
def _k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    d = ref_log_probs - log_probs
    return torch.exp(d) - d - 1


@KL_ESTIMATORS.register("low_var_kl")
def _low_var_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    d = (ref_log_probs - log_probs).clamp(-5.0, 5.0)
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate ``[B, T]`` of kind ``k1 | k2 | k3 | low_var_kl``."""
    return KL_ESTIMATORS.get(kind)(log_probs, ref_log_probs)
