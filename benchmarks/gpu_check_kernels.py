"""GPU check of the fused log-prob kernel (:mod:`arlopti.ops.logprobs`) against the naive one on CUDA.

    PYTHONPATH=src python benchmarks/gpu_check_kernels.py [--dry-run] [--out DIR]

At the Qwen2.5 vocabulary, V = 151,936, with ``hidden [N, H]`` and ``weight [V, H]`` in bf16 (the
dtype FSDP2's bf16 compute hands the head) and in fp32, it runs ``loss = Σ(cg·logp + ce·entropy)``
(random per-token weights) and its backward through ``token_logprobs(impl="naive")`` and
``impl="fused"``, alternating, and reports per dtype:

* ``values``: max |fused − naive| of logp and of the entropy;
* ``grads``: max |fused − naive| of d/dhidden and d/dweight, relative to the naive gradient's max;
* ``memory``: the peak CUDA memory above the inputs (``max_memory_allocated``) of each;
* ``time``: median of 5 forward+backward wall times each (CUDA-synchronised), and their ratio.

PASS when values and gradients agree (fp32: logp 1e-4, grads 1e-4 relative; bf16: logp 2e-2,
grads 2e-2 relative, both paths round the logits GEMM to bf16 once) and the fused peak is below
the naive one. ``--dry-run``: the same on the CPU with N = 64 (no memory or timing verdict).
Last line ``GPU CHECK KERNELS: PASS`` or ``FAIL``; ``<out>/gpu_check_kernels.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

V = 151936
TOLS = {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 2e-2)}


def one(impl: str, h, w, tgt, cg, ce, device: str) -> dict:
    import torch

    from arlopti.ops.logprobs import token_logprobs

    hh, ww = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    logp, ent = token_logprobs(hh, ww, tgt, 1.0, impl=impl, with_entropy=True)
    (cg * logp + ce * ent).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    out = {"s": time.perf_counter() - t0, "logp": logp.detach().float(), "ent": ent.detach().float(),
           "gh": hh.grad.float(), "gw": ww.grad.float()}
    out["peak_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9 if device == "cuda" else None
    return out


def compare(dtype_name: str, n: int, hdim: int, device: str, repeats: int) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(n, hdim, generator=g) * 2).to(device, dtype)
    w = (torch.randn(V, hdim, generator=g) / hdim ** 0.5).to(device, dtype)
    tgt = torch.randint(0, V, (n,), generator=g).to(device)
    cg, ce = torch.randn(n, generator=g).to(device), torch.randn(n, generator=g).to(device)
    runs: dict[str, list] = {"naive": [], "fused": []}
    for i in range(repeats + 1):  # the first round warms up
        for impl in (("naive", "fused") if i % 2 == 0 else ("fused", "naive")):
            r = one(impl, h, w, tgt, cg, ce, device)
            if i:
                runs[impl].append(r)
    a, b = runs["naive"][-1], runs["fused"][-1]
    rel = lambda x, y: float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))  # noqa: E731
    res = {"N": n, "H": hdim, "V": V, "dtype": dtype_name,
           "logp_max_abs": float((a["logp"] - b["logp"]).abs().max()),
           "entropy_max_abs": float((a["ent"] - b["ent"]).abs().max()),
           "grad_hidden_rel": rel(b["gh"], a["gh"]), "grad_weight_rel": rel(b["gw"], a["gw"]),
           "naive_s": statistics.median(r["s"] for r in runs["naive"]),
           "fused_s": statistics.median(r["s"] for r in runs["fused"]),
           "naive_peak_gb": a["peak_gb"], "fused_peak_gb": b["peak_gb"]}
    tv, tg = TOLS[dtype_name]
    res["ok"] = (res["logp_max_abs"] < tv and res["entropy_max_abs"] < 10 * tv and res["grad_hidden_rel"] < tg
                 and res["grad_weight_rel"] < tg and (device != "cuda" or res["fused_peak_gb"] < res["naive_peak_gb"]))
    return res


def main() -> int:
    from gpu_check_args import check_parser  # benchmarks/ is on sys.path when run as a script

    ap = check_parser(__doc__, "CPU, N = 64: plumbing and values only")
    ap.add_argument("--tokens", type=int, default=8192, help="N on CUDA")
    ap.add_argument("--hidden", type=int, default=2048, help="H (Qwen2.5-3B's 2048)")
    args = ap.parse_args()
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("FAIL kernels: torch.cuda.is_available() is False (use --dry-run on CPU)\nGPU CHECK KERNELS: FAIL")
        return 1
    n, hdim, repeats = (64, 64, 1) if args.dry_run else (args.tokens, args.hidden, 5)
    t0 = time.perf_counter()
    rows = []
    for dt in ("float32", "bfloat16"):
        r = compare(dt, n, hdim, device, repeats)
        rows.append(r)
        mem = (f"; peak naive {r['naive_peak_gb']:.2f} GB, fused {r['fused_peak_gb']:.2f} GB"
               if r["naive_peak_gb"] is not None else "")
        print(f"{'PASS' if r['ok'] else 'FAIL'} kernels_{dt}: N={n} H={hdim} V={V}; |logp| {r['logp_max_abs']:.2e}, "
              f"|entropy| {r['entropy_max_abs']:.2e}, grad rel hidden {r['grad_hidden_rel']:.2e} weight "
              f"{r['grad_weight_rel']:.2e}; time naive {r['naive_s'] * 1e3:.1f} ms, fused {r['fused_s'] * 1e3:.1f} ms "
              f"(fused/naive {r['fused_s'] / r['naive_s']:.2f}){mem}", flush=True)
    ok = all(r["ok"] for r in rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
              "torch": torch.__version__, "rows": rows, "ok": ok, "wall_s": round(time.perf_counter() - t0, 1)}
    (out / "gpu_check_kernels.json").write_text(json.dumps(report, indent=2))
    print(f"GPU CHECK KERNELS: {'PASS' if ok else 'FAIL'} ({report['wall_s']} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
