"""``trainer.precision=auto``: bf16 where the device computes it natively, fp32 where it does not.

``bf16-mixed`` (fp32 master weights, gradients and AdamW state; bf16 autocast matmuls in the
training and no-grad forwards; HF rollouts under the same autocast) only pays where the hardware
has bf16 matrix units: CUDA devices that report bf16 support (Ampere and later) and CPUs with
AVX512-BF16 or AMX-BF16, whose oneDNN kernels run bf16 matmuls natively. On other CPUs torch
emulates bf16 matmuls, and a bf16-mixed update ran about 17x slower than fp32 on an AVX2 EPYC
(``benchmarks/bench_mfu.py``; benchmarks/RESULTS.md), so ``auto`` picks ``32-true`` there. Any
other value of ``trainer.precision`` is Lightning's and passes through unchanged; tests and
exactness checks pin ``32-true`` (``debug=smoke`` does).
"""

from __future__ import annotations

import torch

AUTO = "auto"


def native_bf16(accelerator: str | None) -> tuple[bool, str]:
    """Whether ``accelerator`` (Lightning's: ``cpu``, ``gpu``/``cuda``, ``auto``) computes bf16
    matmuls natively, and why (one line for the log)."""
    acc = str(accelerator or "auto").lower()
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible"
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported():
            return True, f"{name} supports bf16"
        return False, f"{name} has no bf16 support"
    if acc not in ("cpu", "auto"):
        return False, f"accelerator {acc!r}: native bf16 is only known for CPUs and CUDA devices"
    units = [n for n, have in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                               ("AMX", torch.cpu._is_amx_tile_supported())) if have]
    if units:
        return True, f"the CPU has {' and '.join(units)}"
    return False, "the CPU has neither AVX512-BF16 nor AMX (bf16 matmuls would be emulated, slower than fp32)"


def resolve_precision(precision, accelerator: str | None) -> tuple[str, str | None]:
    """Lightning's precision for ``trainer.precision`` (``auto`` → ``bf16-mixed`` or ``32-true``)
    and, for ``auto``, why; any other value comes back unchanged with ``None``."""
    if str(precision) != AUTO:
        return precision, None
    native, why = native_bf16(accelerator)
    return ("bf16-mixed" if native else "32-true"), why


__all__ = ["AUTO", "native_bf16", "resolve_precision"]
