"""The decoding step's projections on oneDNN-packed weights (CPU, fp32): the same products, a faster kernel.

A decoding step multiplies a few rows (the batch, one token each) by every weight of the model, so it is
bound by how fast the kernel streams the weights. ``F.linear`` (MKL's ``sgemm``) reads a ``[1536, 576]``
or the ``[49152, 576]`` LM head at 8-21 GB/s for B = 8 on these machines; oneDNN's linear on a weight
reordered once into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` +
``_linear_pointwise``, one of the two kernels inductor's weight prepacking picks from) reads the same
weights at 31-56 GB/s, and MKL's own packed GEMM (``torch.ops.mkl._mkl_linear``, the other) gains nothing
(benchmarks/RESULTS.md, "Decoding on packed weights": every shape of SmolLM2 at B = 8 and 32).

:class:`PackedLinears` keeps one packed copy per projection of a Llama/Qwen2 decoder: q, k and v
concatenated into one weight (one product instead of three small ones), gate and up likewise, o, down
and the LM head each on their own. A copy is re-packed when its weights changed: each weight's autograd
version counter moves with every in-place update (an optimizer step, ``load_state_dict``, a weight sync)
and its storage with a re-assignment, so :meth:`PackedLinears.refresh` (called before each decode)
re-packs exactly what an update touched and nothing otherwise; the seconds it spent are
:attr:`PackedLinears.last_pack_s` (the engine reports them as its sync time).

Same products, other summation order: oneDNN's blocked kernel adds the ``K`` partial products in another
order than MKL's, so a logit differs from the trainer's forward by float32 rounding (about 1e-6
relative; the log-probs stay within 1e-4 of the trainer's, ``tests/rollout/test_packed_linear.py``), and
a sampled token can differ where two Gumbel-perturbed logits tie to that precision. Only plain fp32
``nn.Linear`` modules on the CPU are packed: an adapted (LoRA), quantised or autocast (bf16) projection,
or a model on another device, runs its own module as before. ``rollout.hf_packed=false`` turns it off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn

def packable(modules: Sequence[nn.Module]) -> bool:
    """Whether ``modules`` (projections read by one product) can share a packed weight: plain fp32
    ``nn.Linear`` on the CPU with whole weights (not FSDP2's DTensor shards), same input width, oneDNN
    built in, and no autocast active."""
    if not torch.backends.mkldnn.is_available() or torch.is_autocast_enabled("cpu"):
        return False
    first = modules[0]
    return all(type(m) is nn.Linear and _plain(m.weight) and m.weight.device.type == "cpu"
               and m.weight.dtype == torch.float32 and m.in_features == first.in_features
               and (m.bias is None) == (first.bias is None) for m in modules)


def _plain(weight: Tensor) -> bool:
    """A whole weight in this process: not an FSDP2 shard (a DTensor), nor any other tensor subclass."""
    return type(weight.data) is torch.Tensor


def _stamp(modules: Sequence[nn.Module]) -> tuple:
    """What changes when any weight (or bias) of ``modules`` is updated in place or replaced."""
    return tuple((p._version, p.data_ptr()) for m in modules for p in (m.weight, m.bias) if p is not None)


class _Packed:
    """One packed product: ``x @ cat(weights).T + cat(biases)``, split back per module."""

    def __init__(self, modules: Sequence[nn.Module], batch: int):
        self.modules = tuple(modules)
        self.sizes = [m.out_features for m in modules]
        self.stamp = _stamp(modules)
        with torch.no_grad():
            weight = torch.cat([m.weight for m in modules]) if len(modules) > 1 else modules[0].weight
            self.bias = (torch.cat([m.bias for m in modules]) if len(modules) > 1 else modules[0].bias
                         ) if modules[0].bias is not None else None
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch)

    def __call__(self, x: Tensor) -> tuple[Tensor, ...]:
        out = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return (out,) if len(self.sizes) == 1 else out.split(self.sizes, dim=-1)


class PackedLinears:
    """Packed copies of a decoder's projections (module docstring), by groups of modules."""

    def __init__(self):
        self.groups: dict[tuple[int, ...], _Packed] = {}
        self.last_pack_s = 0.0

    def refresh(self, groups: Sequence[Sequence[nn.Module]], batch: int) -> None:
        """Pack every packable group of ``groups`` whose weights changed since it was packed (or that
        was never packed); drop the copies of groups no longer asked for."""
        t0 = time.perf_counter()
        kept: dict[tuple[int, ...], _Packed] = {}
        for modules in groups:
            if not packable(modules):
                continue
            key = tuple(id(m) for m in modules)
            old = self.groups.get(key)
            fresh = old is not None and old.modules == tuple(modules) and old.stamp == _stamp(modules)
            kept[key] = old if fresh else _Packed(modules, batch)
        self.groups = kept
        self.last_pack_s = time.perf_counter() - t0

    def __call__(self, modules: Sequence[nn.Module], x: Tensor) -> tuple[Tensor, ...]:
        """``tuple(m(x) for m in modules)``, from the packed copy when there is one."""
        packed = self.groups.get(tuple(id(m) for m in modules))
        if packed is None or torch.is_autocast_enabled("cpu"):
            return tuple(m(x) for m in modules)
        return packed(x)


__all__ = ["PackedLinears", "packable"]
