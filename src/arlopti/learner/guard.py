"""The non-finite step guard: skip a step whose loss or gradient norm is not finite, abort after
``algorithm.max_consecutive_skips`` such steps in a row. Its counters are saved in checkpoints.

A step whose loss and gradient norm were finite can still poison the weights (a huge learning
rate, an optimizer overflow): after every optimizer step the learner checks the updated parameters
with :func:`tensors_finite` (one fused reduction over the parameters) and
:meth:`NonFiniteGuard.check_weights` aborts the run before anything can save them.

A learning rate can also be finite and absurd (``optim.lr=1e30`` ran to the end with weights near
1e28, issue 38): before the process's first optimizer step, :meth:`NonFiniteGuard.check_first_step`
computes the update that step is about to apply (:func:`first_step_size`) and warns when it is larger
than the weights it updates.

Such weights stay finite (near 1e29 at ``optim.lr=1e30``) while the forward pass overflows: the
policy's own log-probs of its samples come out NaN (issue 42: the run went on to ``kl nan`` and the
diagnostics died on an index error). :meth:`NonFiniteGuard.check_log_probs` stops the run at the
first such step, before any optimizer step of it (skipping cannot help: a skipped step leaves the
weights as they are). Every abort names its cause (the first step's warning when there was one) and
the fix; an abort that leaves the weights as they were at the start of the rollout step
(:attr:`NonFiniteAbort.clean`) lets the checkpoint callback save them (the last finite weights) and
name the file in the same line (:attr:`NonFiniteAbort.checkpoint_note`)."""

from __future__ import annotations

import logging
import math
from typing import Iterable

import torch

log = logging.getLogger(__name__)


class NonFiniteAbort(RuntimeError):
    """The run stops: a non-finite loss, gradient, weight or log-prob. ``clean``: the weights are still
    those of the start of this rollout step (finite, no optimizer step of the step taken), so they may
    be saved; ``checkpoint_note``: set by whoever saved them (or says why not), shown after the message."""

    def __init__(self, message: str, *, clean: bool = False):
        super().__init__(message)
        self.message, self.clean = message, clean
        self.checkpoint_note: str | None = None

    def __str__(self) -> str:
        return self.message + (f" {self.checkpoint_note}" if self.checkpoint_note else "")


class NonFiniteGuard:
    def __init__(self, max_consecutive: int):
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0
        self.poisoned = False  # set when check_weights found non-finite weights
        self.first_step_checked = False  # check_first_step ran in this process
        self.cause: str | None = None  # what check_first_step warned about, named by every later abort
        self._stepped_at: int | None = None  # the rollout step of the last optimizer step taken

    def allow(self, finite: bool, *, loss: float, grad_norm: float, rollout_step: int) -> bool:
        """True: take the step. False: skip it (counted). Raises :class:`NonFiniteAbort` after
        ``max_consecutive`` skips in a row. ``finite`` must already agree over ranks."""
        if finite:
            self.consecutive = 0
            self._stepped_at = rollout_step
            return True
        self.consecutive += 1
        self.total += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteAbort(
                f"{self.consecutive} consecutive optimizer steps had a non-finite loss or gradient "
                f"(last loss={loss}, grad_norm={grad_norm}) at rollout step {rollout_step}{self._because()}. "
                "Lower optim.lr, check the reward and the data, or raise algorithm.max_consecutive_skips.",
                clean=self._stepped_at != rollout_step)
        return False

    def check_log_probs(self, finite: bool, *, rollout_step: int) -> None:
        """Raise :class:`NonFiniteAbort` (``clean``: no optimizer step of this rollout step was taken)
        when the policy's log-probs of its own samples hold a NaN (``finite`` must already agree over
        ranks). Its weights are finite (:meth:`check_weights` passed), so its forward overflows: they
        have diverged, and every later step would be NaN as well."""
        if finite:
            return
        raise NonFiniteAbort(
            f"the policy's log-probs of its own samples are NaN after {rollout_step} rollout steps although its "
            f"weights are finite: they have diverged{self._because()}. The run stops before this step's update; "
            "lower optim.lr (or set optim.grad_clip) and start the run again.", clean=True)

    def _because(self) -> str:
        return f" (cause: {self.cause})" if self.cause else ""

    def check_weights(self, finite: bool, *, rollout_step: int, lr: float, loss: float, grad_norm: float) -> None:
        """Raise :class:`NonFiniteAbort` when an optimizer step left non-finite weights (``finite``
        must already agree over ranks). Such weights are never checkpointed: the run stops here."""
        if finite:
            return
        self.poisoned = True
        raise NonFiniteAbort(
            f"the optimizer step at rollout step {rollout_step} made the weights non-finite although its loss and "
            f"gradient were finite (lr={lr:g}, loss={loss}, grad_norm={grad_norm}){self._because()}. The run stops "
            "before any checkpoint of these weights is saved; lower optim.lr (or set a smaller optim.grad_clip) and "
            "resume from the last checkpoint.")

    def check_first_step(self, optimizer, rollout_step: int) -> str | None:
        """Before this process's first optimizer step (gradients clipped, not yet applied): warn (and
        return the message) when the update (:func:`first_step_size`, at the full learning rate) is
        larger than the trainable weights' own norm. Collective under FSDP2: every rank calls it."""
        if self.first_step_checked:
            return None
        self.first_step_checked = True
        size = first_step_size(optimizer)
        if size is None or not size[1] > 0 or size[0] <= size[1]:
            return None
        (update, weights), lr = size, _peak_lr(optimizer)
        msg = (f"optim.lr={lr:g}: the first optimizer step (rollout step {rollout_step + 1}) would move the trainable "
               f"weights by {update:.3g} (the update's norm at the full learning rate), {update / weights:.3g} x "
               f"their own norm {weights:.3g}: the run diverges or loses what the model knew. Lower optim.lr "
               "(the experiments use 1e-6)")
        self.cause = (f"optim.lr={lr:g}: the first optimizer step moved the weights by {update / weights:.3g} x their "
                      "own norm")
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            log.warning(msg)
        return msg

    def state_dict(self) -> dict:
        return {"total_skips": self.total, "consecutive_skips": self.consecutive}

    def load_state_dict(self, state: dict) -> None:
        self.total = int(state.get("total_skips", 0))
        self.consecutive = int(state.get("consecutive_skips", 0))


def local_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's part of each tensor (a DTensor's local shard), empty ones dropped."""
    out = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.numel() and (local.is_floating_point() or local.is_complex()):
            out.append(local.detach())
    return out


def tensors_finite(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """A 0-dim bool tensor: whether every element of this rank's part of ``tensors`` is finite.

    On CUDA one fused max-abs reduction per dtype (``torch._foreach_norm(ord=inf)``: NaN
    propagates, ±inf stays inf), and nothing synchronises until the caller reads the result. On
    CPU, where that kernel is ~10x slower than a plain sum (benchmarks/RESULTS.md,
    bench_finite_check), one sum per tensor: a finite sum implies finite elements (±inf and NaN
    propagate); only a non-finite sum (which a finite tensor of values near float's max can give
    by overflow) is confirmed with the exact max-abs reduction. Nothing is copied."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in local_tensors(tensors):
        groups.setdefault((t.device, t.dtype), []).append(t)
    if not groups:
        return torch.tensor(True)
    flags = []
    for (device, _), ts in groups.items():
        if device.type == "cpu" and bool(torch.stack([t.sum(dtype=torch.float32) for t in ts]).isfinite().all()):
            flags.append(torch.tensor(True))
            continue
        flags.append(_max_abs_finite(ts))
    if len({f.device for f in flags}) > 1:
        flags = [f.cpu() for f in flags]
    return torch.stack(flags).all()


def _max_abs_finite(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([n.float() for n in torch._foreach_norm(ts, math.inf)]).isfinite().all()


def clip_global_norm(params: list[torch.Tensor], max_norm: float | None) -> float:
    """Clip the gradients of ``params`` (those with one) by their global norm (``max_norm=None``:
    measure only) and return that norm: global over ranks (a DTensor norm under FSDP2 is gathered
    to a full one; under DDP the gradients are already averaged)."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


def _peak_lr(optimizer) -> float:
    """The largest learning rate of the optimizer's groups before any schedule (``initial_lr``)."""
    return max(float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups)


def _norm_sq(t: torch.Tensor) -> float:
    n = torch.linalg.vector_norm(t.float())
    return float(n.full_tensor() if hasattr(n, "full_tensor") else n) ** 2  # a DTensor's norm: all its shards


@torch.no_grad()
def first_step_size(optimizer) -> tuple[float, float] | None:
    """``(‖Δ‖, ‖W‖)``: the norm of the update ``optimizer``'s first step applies to its parameters
    from their current gradients, at each group's full learning rate (``initial_lr``: before a
    warmup's multiplier), and the norm of those parameters. None for an optimizer other than the
    two ``optim.name`` builds (AdamW, SGD).

    torch's first AdamW step: m = (1 − β1) g, v = (1 − β2) g², and after bias correction
    Δ = lr · g / (|g| + eps) + lr · wd · W (decoupled decay), about lr per element with a gradient.
    SGD's: Δ = lr · (g + wd · W), times (1 + momentum) with Nesterov. Parameters without a gradient
    count in ‖W‖ only. One pass over the parameters (each DTensor's norm a collective)."""
    kind = type(optimizer).__name__
    if kind not in ("AdamW", "SGD"):
        return None
    update = weights = 0.0
    for g in optimizer.param_groups:
        lr, wd = float(g.get("initial_lr", g["lr"])), float(g.get("weight_decay", 0.0))
        for p in g["params"]:
            weights += _norm_sq(p)
            if p.grad is None:
                continue
            grad = p.grad.float()
            if kind == "SGD":
                step = (grad + wd * p.float()) * (1.0 + (float(g.get("momentum", 0.0)) if g.get("nesterov") else 0.0))
            else:
                step = grad / (grad.abs() + float(g["eps"])) + wd * p.float()
            update += lr * lr * _norm_sq(step)  # lr outside the norm: 1e30 x a float32 tensor overflows
    return math.sqrt(update), math.sqrt(weights)
