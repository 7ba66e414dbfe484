"""One-step updates from fixed weights: the loss gradients several analyses share, and applying them.

Every analysis here starts from the same weights θ and the same batch, with
``old_log_probs = log π_θ`` at the rollout temperature (so the PPO ratio is 1 and no clip is
active at θ). A *loss spec* is ``(advantages [B, R], phase_mask [B, R])``; its loss is the
learner's :func:`arlopti.algorithms.grpo_objective` with that phase mask, normalised by **all**
valid tokens of the batch (``lopti.normalize=all`` with ``scale=LossScale(N)``, N the batch's token count,
the official Lopti normalisation), KL coefficient 0 (no reference model; at θ = θ_ref its gradient is
0 anyway) and no entropy bonus. At θ its gradient is exactly

    ∇L = −(1/N) Σ_t m_t A_t ∇log π_θ(o_t)

so specs that partition the tokens have gradients that sum to the all-token gradient.

:func:`loss_gradients` computes several specs' parameter gradients from **one** forward pass per
micro-batch (one backward per spec, the graph retained in between), accumulating each into its
own fp32 buffer (memory: one parameter-sized buffer per spec); the loop is :func:`accumulate_gradients`,
which :func:`arlopti.analysis.compare_methods.objective_gradients` shares. :func:`apply_gradient` takes one
optimizer step with a given gradient; :class:`WeightSnapshot` restores θ between experiments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from arlopti.algorithms import LossScale, grpo_objective
from arlopti.config import AlgorithmConfig
from arlopti.learner.policy import batched_logprobs

OPTIMIZERS = ("sgd", "adamw")
ANALYSIS_LOSS = AlgorithmConfig(kl_coef=0.0, entropy_coef=0.0)


@dataclass(frozen=True)
class LossSpec:
    """The advantages and the tokens one loss trains on (both ``[B, R]``; see module docstring)."""

    advantages: Tensor
    phase_mask: Tensor


def trainable(policy) -> list[torch.nn.Parameter]:
    return [p for p in policy.parameters() if p.requires_grad]


@torch.no_grad()
def sampled_log_probs(policy, batch, micro_batch_size: int = 8) -> Tensor:
    """``[B, R]`` log-probs of the batch's sampled tokens at its temperature (eval mode), 0 on padding."""
    was = policy.training
    policy.eval()
    try:
        logp, _ = batched_logprobs(policy, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                   batch.temperature, micro_batch_size)
    finally:
        policy.train(was)
    return logp * batch.response_mask


def micro_batches(batch, size: int) -> Iterator[tuple[Tensor, Tensor, Tensor, int]]:
    """``(rows, input_ids, attention_mask, r)`` chunks of ``size`` rows, cut to their longest response."""
    if size < 1:
        raise ValueError(f"--micro-batch must be >= 1, got {size}")
    for lo in range(0, len(batch), size):
        rows = torch.arange(lo, min(lo + size, len(batch)))
        r = max(1, int(batch.response_mask[rows].sum(-1).max()))
        cut = batch.prompt_len + r
        yield rows, batch.input_ids[rows, :cut], batch.attention_mask[rows, :cut], r


def accumulate_gradients(policy, batch, keys: Iterable[str], micro_batch_size: int,
                         forward: Callable[[Tensor, Tensor], Any],
                         losses: Callable[[Tensor, int, Any], Iterable[tuple[str, Tensor]]]
                         ) -> dict[str, list[Tensor]]:
    """Per-key parameter gradients (fp32, aligned with :func:`trainable`) summed over the micro-batches of
    :func:`micro_batches` at the current weights: per micro-batch one ``out = forward(ids, attn)`` (eval mode,
    with grad), then one ``autograd.grad`` of each ``(key, loss)`` that ``losses(rows, r, out)`` yields, the
    graph retained while it yields another (the next loss is asked for before each backward). A key it never
    yields keeps its zeros, as does every key of a batch without a valid token."""
    params = trainable(policy)
    bank = {k: [torch.zeros_like(p, dtype=torch.float32) for p in params] for k in keys}
    if not bank or float(batch.response_mask.sum()) == 0:
        return bank
    was = policy.training
    policy.eval()  # no dropout anyway; eval keeps the forward identical to the no-grad passes
    try:
        for rows, ids, attn, r in micro_batches(batch, micro_batch_size):
            with torch.enable_grad():
                pending = iter(losses(rows, r, forward(ids, attn)))
                item = next(pending, None)
                while item is not None:
                    following = next(pending, None)  # another loss still needs the graph
                    grads = torch.autograd.grad(item[1], params, retain_graph=following is not None,
                                                allow_unused=True)
                    for acc, g in zip(bank[item[0]], grads):
                        if g is not None:
                            acc.add_(g.float())
                    item = following
    finally:
        policy.train(was)
    return bank


def loss_gradients(policy, batch, old_log_probs: Tensor, specs: dict[str, LossSpec],
                   micro_batch_size: int = 4, log_probs_fn=None) -> dict[str, list[Tensor]]:
    """Per-spec parameter gradients (fp32, aligned with :func:`trainable`) at the current weights.

    ``old_log_probs`` is the ratio's denominator (the rollout policy); at θ itself pass the
    current log-probs. Gradients are accumulated over micro-batches (:func:`accumulate_gradients`); the
    loss of every micro-batch is divided by the batch's total valid-token count, so the sum is the batch
    token-mean. A spec without a live token (in its phase, valid, A ≠ 0) in a micro-batch is skipped there:
    its gradient from it is exactly 0.
    """
    scale = LossScale(float(batch.response_mask.sum()))

    def forward(ids: Tensor, attn: Tensor) -> Tensor:
        if log_probs_fn is not None:
            return log_probs_fn(ids, attn)
        return policy(ids, attn, batch.prompt_len, batch.temperature, with_entropy=False)[0]

    def losses(rows: Tensor, r: int, logp: Tensor) -> Iterator[tuple[str, Tensor]]:
        mask = batch.response_mask[rows, :r]
        for name, spec in specs.items():
            adv, phase = spec.advantages[rows, :r], spec.phase_mask[rows, :r]
            if bool((phase.bool() & mask.bool() & (adv != 0)).any()):
                yield name, grpo_objective(logp, old_log_probs[rows, :r], adv, mask, phase, ANALYSIS_LOSS,
                                           scale=scale)[0]

    return accumulate_gradients(policy, batch, specs, micro_batch_size, forward, losses)


def grad_norm(grads: list[Tensor]) -> float:
    """Global L2 norm of a list of gradient tensors."""
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))) if grads else 0.0


def add_gradients(*banks: list[Tensor]) -> list[Tensor]:
    """Elementwise sum of several aligned gradient lists."""
    return [torch.stack(parts).sum(0) for parts in zip(*banks)]


class WeightSnapshot:
    """A copy of the trainable weights; ``restore()`` writes it back (in place, same tensors)."""

    def __init__(self, policy):
        self.params = trainable(policy)
        self.saved = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def restore(self) -> None:
        for p, s in zip(self.params, self.saved):
            p.copy_(s)
            p.grad = None


def make_optimizer(policy, name: str, lr: float) -> torch.optim.Optimizer:
    """Plain SGD (no momentum, no weight decay: the paper's Fig. 1 optimiser) or AdamW (the learner's
    defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01), fresh state."""
    if lr <= 0:
        raise ValueError(f"--lr must be > 0, got {lr}")
    params = trainable(policy)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0, weight_decay=0.0)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    raise ValueError(f"--optimizer {name!r}: choose one of {list(OPTIMIZERS)}")


def apply_gradient(policy, optimizer: torch.optim.Optimizer, grads: list[Tensor],
                   grad_clip: float | None = None) -> float:
    """One ``optimizer.step()`` with ``grads`` as the parameters' gradients; returns the pre-clip norm."""
    params = trainable(policy)
    for p, g in zip(params, grads):
        p.grad = g.to(p.dtype).clone()
    norm = grad_norm(grads)
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def bucket_specs(old_log_probs: Tensor, response_mask: Tensor, advantages: Tensor) -> dict[str, LossSpec]:
    """One spec per probability bucket (``b0`` … ``b3``): the advantages kept only on that bucket's
    tokens, the official ``mask_prob_intervalK`` experiment."""
    from arlopti.plugins.buckets import NUM_BUCKETS, bucket_index

    idx = bucket_index(torch.exp(old_log_probs.detach().float()))
    valid = response_mask.bool()
    return {f"b{b}": LossSpec(advantages, ((idx == b) & valid).float()) for b in range(NUM_BUCKETS)}
