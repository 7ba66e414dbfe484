"""``trainer.precision=auto``: bf16-mixed where it is native, measured faster and known to learn like fp32;
and what bf16-mixed needs to learn like fp32 (issue 49).

``bf16-mixed`` (fp32 master weights, gradients and AdamW state; bf16 autocast matmuls in the training and
no-grad forwards) only pays where the hardware has bf16 matrix units: CUDA devices that report bf16 support
(Ampere and later) and CPUs with AVX512-BF16 or AMX-BF16. On other CPUs torch emulates bf16 matmuls, and a
bf16-mixed update ran about 17x slower than fp32 on an AVX2 EPYC (benchmarks/RESULTS.md), so ``auto`` never
picks it there. Where the flags are present the gain still differs between the pool's CPUs (a 1024^3 bf16
GEMM at 2.2x fp32's on one AVX512-BF16 EPYC, 4.1-4.5x on another), so on a CPU ``auto`` measures both GEMM
rates once per machine (CPU model and torch version), caches them (:func:`cached_gemm_rates`) and picks
bf16-mixed only if bf16 is at least :data:`MIN_BF16_GEMM_SPEEDUP` times faster. Neither a CPU nor a GPU gets
it unless :data:`BF16_LEARNS_LIKE_FP32`. Any other value of ``trainer.precision`` is Lightning's and passes
through unchanged; tests and exactness checks pin ``32-true`` (``debug=smoke`` does).

Learning like fp32 needs fp32 masters that do not all sit on the bf16 grid (:func:`spread_master_weights`, issue
49), which the learner's set-up applies under a mixed precision, before the cold start and the first rollout.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

AUTO = "auto"
#: Whether bf16-mixed learns like fp32 (issue 49's goal): the demo's cold-start curve and its table under
#: bf16-mixed within fp32's seed-to-seed spread over 3 seeds. The curve is (since the learner spreads the masters,
#: :func:`spread_master_weights`: at most 0.006 from fp32 on the same batches where the seeds span 0.03-0.23;
#: ``benchmarks/bench_bf16_parity.py --parts coldstart``, RESULTS.md "bf16-mixed against fp32"); the table was
#: run once in bf16-mixed and not yet over seeds, so this stays False and ``auto`` picks bf16-mixed nowhere.
BF16_LEARNS_LIKE_FP32 = False
#: How much faster than fp32's a CPU's 1024^3 bf16 GEMM must be for ``auto`` to pick bf16-mixed there: autocast's
#: casts, the fp32 parts of the step and SDPA's slower bf16 backward eat into the GEMM's gain (issue 49: a bf16
#: GEMM at 2.2x fp32's made the demo's update 1.2-1.25x faster), so a GEMM gain below 1.5x would not pay.
MIN_BF16_GEMM_SPEEDUP = 1.5
#: the cache of the measured rates, in the project's cache folder (``$ARLOPTI_CACHE``)
RATES_FILE = "precision_auto.json"


def _device_kind(accelerator: str | None) -> str:
    """``cuda``, ``cpu`` or the accelerator's own name, for Lightning's ``trainer.accelerator``."""
    acc = str(accelerator or "auto").lower()
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu" if acc in ("cpu", "auto") else acc


def native_bf16(accelerator: str | None) -> tuple[bool, str]:
    """Whether ``accelerator`` (Lightning's: ``cpu``, ``gpu``/``cuda``, ``auto``) computes bf16
    matmuls natively, and why (one line for the log)."""
    kind = _device_kind(accelerator)
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible"
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported():
            return True, f"{name} supports bf16"
        return False, f"{name} has no bf16 support"
    if kind != "cpu":
        return False, f"accelerator {kind!r}: native bf16 is only known for CPUs and CUDA devices"
    units = [n for n, have in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                               ("AMX", torch.cpu._is_amx_tile_supported())) if have]
    if units:
        return True, f"the CPU has {' and '.join(units)}"
    return False, "the CPU has neither AVX512-BF16 nor AMX (bf16 matmuls would be emulated, slower than fp32)"


def measure_gemm_rates() -> dict[str, float]:
    """This machine's 1024^3 GEMM in GFLOP/s, fp32 and bf16 (best of 5 each, :func:`arlopti.utils.machine.gemm_flops`,
    about half a second on 2 cores)."""
    from arlopti.utils.machine import gemm_flops

    return {"fp32_gflops": round(gemm_flops(1024, 5, torch.float32) / 1e9, 1),
            "bf16_gflops": round(gemm_flops(1024, 5, torch.bfloat16) / 1e9, 1)}


def machine_key() -> str:
    """What the cached rates are valid for: the CPU model (:func:`arlopti.utils.machine.cpu_id`) and torch's
    version (its kernels)."""
    from arlopti.utils.machine import cpu_id

    return f"{cpu_id()} | torch {torch.__version__}"


def _read_rates(cache_file: Path | None) -> dict:
    try:
        entries = json.loads(Path(cache_file).read_text()) if cache_file is not None else {}
    except (OSError, ValueError):
        entries = {}  # absent or unreadable: measured again and written over
    return entries if isinstance(entries, dict) else {}


def _valid_rates(rates) -> bool:
    return isinstance(rates, dict) and all(isinstance(rates.get(k), (int, float)) and rates[k] > 0
                                           for k in ("fp32_gflops", "bf16_gflops"))


def cached_gemm_rates(cache_file: Path | None, key: str,
                      measure: Callable[[], dict] | None = None) -> tuple[dict, bool]:
    """``(rates, whether they came from the cache)``: ``key``'s entry of the JSON file ``cache_file``, else
    ``measure()`` (default :func:`measure_gemm_rates`), written there under ``key`` (``cache_file`` None: not
    kept). A file that cannot be written is logged and the rates used anyway."""
    entries = _read_rates(cache_file)
    if _valid_rates(entries.get(key)):
        return entries[key], True
    rates = (measure or measure_gemm_rates)()
    if cache_file is not None:
        try:
            Path(cache_file).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(f"{cache_file}.tmp{os.getpid()}")
            tmp.write_text(json.dumps({**entries, key: rates}, indent=1) + "\n")
            tmp.replace(cache_file)
        except OSError as err:
            log.warning("trainer.precision=auto: could not cache the GEMM rates in %s (%s); measured again next time",
                        cache_file, err)
    return rates, False


def choose_cpu_precision(native: bool, why: str, rates: dict | None, learns_like_fp32: bool) -> tuple[str, str]:
    """``auto``'s choice on a CPU and its reason (with the two rates where the CPU has native bf16): bf16-mixed only
    with native bf16, :data:`BF16_LEARNS_LIKE_FP32` and a bf16 GEMM at least :data:`MIN_BF16_GEMM_SPEEDUP` times
    fp32's (``rates``: :func:`measure_gemm_rates`)."""
    if not native:
        return "32-true", why
    speedup = rates["bf16_gflops"] / rates["fp32_gflops"]
    measured = (f"{why}; 1024^3 GEMM bf16 {rates['bf16_gflops']:.1f} GFLOP/s, fp32 {rates['fp32_gflops']:.1f}: "
                f"{speedup:.2f}x (bf16-mixed from {MIN_BF16_GEMM_SPEEDUP}x)")
    if not learns_like_fp32:
        return "32-true", f"{measured}, but bf16-mixed is not shown to learn like fp32 (BF16_LEARNS_LIKE_FP32)"
    return ("bf16-mixed" if speedup >= MIN_BF16_GEMM_SPEEDUP else "32-true"), measured


def mixed_compute_dtype(precision) -> torch.dtype | None:
    """The low-precision dtype a run computes in over fp32 master weights: bf16 for ``bf16-mixed`` (or FSDP2's
    ``bfloat16-mixed``), fp16 for ``16-mixed`` / ``fp16-mixed`` / ``float16-mixed``; None for anything else
    (fp32 compute, or ``*-true``, which keeps no fp32 master weights)."""
    p = str(precision or "").lower()
    if not p.endswith("-mixed"):
        return None
    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "16": torch.float16, "fp16": torch.float16,
            "float16": torch.float16}.get(p[: -len("-mixed")])


@torch.no_grad()
def spread_within_rounding(weight: torch.Tensor, dtype: torch.dtype, generator: torch.Generator,
                           chunk: int = 1 << 22) -> int:
    """Move each element of the fp32 ``weight`` that ``dtype`` (bf16 or fp16) represents exactly to a uniformly
    random point of the interval that rounds to it, in place; returns how many moved. The ``dtype`` cast of
    every element is unchanged (checked: an element whose cast would change stays where it was). Works through
    ``chunk`` elements at a time (a few temporaries of that size)."""
    parts = weight.view(-1).split(chunk) if weight.is_contiguous() else (weight,)
    return sum(_spread_part(part, dtype, generator) for part in parts)


def _spread_part(weight: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> int:
    low = weight.to(dtype)
    on_grid = (low.float() == weight) & (weight != 0) & torch.isfinite(weight)
    bits = low.view(torch.int16)
    above, below = ((bits + step).view(dtype).float() for step in (1, -1))
    ends = torch.stack([(weight + above) / 2, (weight + below) / 2])
    lo, hi = ends.amin(0), ends.amax(0)
    moved = lo + (hi - lo) * torch.rand(weight.shape, generator=generator, device=weight.device)
    keep = on_grid & (moved.to(dtype) == low) & torch.isfinite(moved) & (moved != weight)
    weight.copy_(torch.where(keep, moved, weight))
    return int(keep.sum())


def spread_master_weights(module: torch.nn.Module, dtype: torch.dtype | None, seed: int = 0) -> int:
    """Under a mixed precision that computes in ``dtype`` (bf16 or fp16; anything else: do nothing), spread the
    trainable fp32 weight matrices of ``module`` within their rounding intervals (:func:`spread_within_rounding`);
    returns how many elements moved.

    Why (issue 49): a model loaded from a bf16 checkpoint has every fp32 master weight exactly on the bf16 grid,
    the middle of its rounding interval, so the forward's bf16 cast ignores an update until it exceeds half a
    bf16 step (2^-9 of the weight): after the demo's first cold-start step (lr 5e-5) 7% of the casts had
    changed. Spread uniformly within the interval, an update ``d`` changes a cast with probability
    ``|d| / step``, so the cast follows the master weight in expectation, as stochastic rounding would. The
    forward's casts are unchanged, so the model computes as loaded; norms and biases (1-D, computed in fp32)
    are left alone. The generator is seeded here, so every rank moves its weights alike."""
    if dtype not in (torch.bfloat16, torch.float16):
        return 0
    generators: dict[torch.device, torch.Generator] = {}
    moved = 0
    for p in module.parameters():
        if p.requires_grad and p.dim() >= 2 and p.dtype == torch.float32 and not p.is_meta:
            if p.device not in generators:
                generators[p.device] = torch.Generator(p.device).manual_seed(seed)
            moved += spread_within_rounding(p.data, dtype, generators[p.device])
    return moved


def resolve_precision(precision, accelerator: str | None, cache_file: Path | None = None,
                      measure: Callable[[], dict] | None = None,
                      learns_like_fp32: bool | None = None) -> tuple[str, str | None]:
    """Lightning's precision for ``trainer.precision`` (``auto`` → ``bf16-mixed`` or ``32-true``) and, for
    ``auto``, why; any other value comes back unchanged with ``None``. On a CPU with native bf16 the GEMM rates
    come from ``cache_file`` or ``measure`` (:func:`cached_gemm_rates`); ``learns_like_fp32`` defaults to
    :data:`BF16_LEARNS_LIKE_FP32`."""
    if str(precision) != AUTO:
        return precision, None
    learns = BF16_LEARNS_LIKE_FP32 if learns_like_fp32 is None else learns_like_fp32
    native, why = native_bf16(accelerator)
    if _device_kind(accelerator) == "cuda":
        if native and not learns:
            return "32-true", f"{why}, but bf16-mixed is not shown to learn like fp32 (BF16_LEARNS_LIKE_FP32)"
        return ("bf16-mixed" if native else "32-true"), why
    rates, cached = cached_gemm_rates(cache_file, machine_key(), measure) if native else (None, False)
    choice, reason = choose_cpu_precision(native, why, rates, learns)
    if rates is not None:
        reason += f"; {'cached in' if cached else 'measured now, cached in'} {cache_file}" if cache_file else ""
    return choice, reason


__all__ = ["AUTO", "BF16_LEARNS_LIKE_FP32", "MIN_BF16_GEMM_SPEEDUP", "RATES_FILE", "cached_gemm_rates",
           "choose_cpu_precision", "machine_key", "measure_gemm_rates", "mixed_compute_dtype", "native_bf16",
           "resolve_precision", "spread_master_weights", "spread_within_rounding"]
