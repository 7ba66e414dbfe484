"""The one function every per-token log-prob in the project goes through.

``token_logprobs(hidden, weight, targets, temperature)`` returns, for each row ``n``,

    logp[n]    = log softmax(hidden[n] @ weight.T / T)[targets[n]]
    entropy[n] = -sum_v p[n, v] log p[n, v],   p[n] = softmax(hidden[n] @ weight.T / T)

Old, reference and training log-probs all come from here, so the temperature is applied the
same way everywhere (the official code divides the logits by the rollout temperature in every
forward). ``impl="naive"`` materialises the ``[N, V]`` logits in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_from_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                         with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """Naive reference: fp32 log-softmax over the full vocabulary. ``logits`` is ``[..., V]``."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0,
                   bias: Tensor | None = None, impl: str = "naive",
                   with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and entropy) of ``targets`` under the LM head ``weight``.

    Shapes: ``hidden [N, H]``, ``weight [V, H]``, ``targets [N]`` → ``[N]`` each (fp32).
    """
    if impl == "naive":
        logits = hidden @ weight.t()
        if bias is not None:
            logits = logits + bias
        return logprobs_from_logits(logits, targets, temperature, with_entropy)
    raise ValueError(f"model.logprob_impl={impl!r} is unknown; use 'fused' or 'naive'")
