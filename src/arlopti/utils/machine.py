"""The machine a time was taken on: its CPU, its cores and its fp32 GEMM rate, measured.

Every time the project reports (a run's summary, benchmarks/RESULTS.md) is read against the machine's own
limit, because the CPUs of the pool differ by about 3x; this is the one measurement of the GEMM rate, which
``benchmarks/_common.py`` uses too.
"""

from __future__ import annotations

import os
import platform
import time


def gemm_flops(n: int = 1024, repeats: int = 3, dtype=None) -> float:
    """Best FLOP/s of ``a @ b`` for ``n`` x ``n`` matrices of ``dtype`` (default fp32; 2 n^3 FLOPs per product),
    after one untimed product, with torch's current thread count (about 40 ms at n = 1024 on 2 cores)."""
    import torch

    a, b = torch.randn(n, n).to(dtype or torch.float32), torch.randn(n, n).to(dtype or torch.float32)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what :func:`platform.processor` says."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        platform.processor())
    except OSError:
        return platform.processor()


def cpu_id() -> str:
    """The CPU's name with its family, model and stepping (``/proc/cpuinfo``): a VM may show every EPYC of the pool
    as ``AMD EPYC``, while these tell the generations apart (family 25 model 17: a Zen 4 EPYC)."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(ln.split(":", 1) for ln in f.read().split("\n\n")[0].splitlines() if ":" in ln)
    except OSError:
        return cpu_name()
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    parts = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields]
    return f"{cpu_name()} ({', '.join(parts)})" if parts else cpu_name()


def machine() -> dict:
    """The CPU's name (and :func:`cpu_id`), core count and fp32 GEMM rate in GFLOP/s (:func:`gemm_flops`)."""
    return {"cpu": cpu_name(), "cpu_id": cpu_id(), "cores": os.cpu_count(),
            "gemm_fp32_gflops": round(gemm_flops() / 1e9, 1)}


__all__ = ["cpu_id", "cpu_name", "gemm_flops", "machine"]
