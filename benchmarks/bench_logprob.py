"""Token log-probs + entropy, forward and backward: fused (ours) vs naive vs TRL 1.16's chunked function.

What one sample measures (in a fresh process, see ``benchmarks/_common.py``): build
``hidden [N, H]`` and ``weight [V, H]`` (both ``requires_grad``) and ``targets [N]``; take the
RSS high-water mark as the baseline; run ``loss = Σ(cg·logp + ce·entropy)`` with random
per-token weights ``cg``, ``ce`` and ``loss.backward()``; report the wall time of that and the
growth of the RSS high-water mark (this includes the ``[V, H]`` and ``[N, H]`` gradients, which
every implementation has to produce). Samples of the implementations are interleaved
(A B C, B C A, ...) and the median is reported.

Implementations:
  ``naive``  ``token_logprobs(impl="naive")``: full fp32 ``[N, V]`` logits, autograd backward.
  ``fused``  ``token_logprobs(impl="fused")``: :class:`arlopti.ops.logprobs.FusedTokenLogprobs`.
  ``trl``    ``trl.kernels.chunked_logprob.ChunkedLogProbFunction`` from TRL 1.16, called as TRL's
             ``add_fused_lm_head`` calls it: ``(hidden, weight, bias, targets, temperature,
             chunk_size=32768, final_logit_softcapping=None, logit_scale=1.0,
             outputs=("entropy",))``; on CPU it tiles 4096 tokens × 32768 vocab entries in torch.
             Needs ``pip install --no-deps trl==1.16.0``; reported as unavailable otherwise.

Cases: ``small`` (N=2048, H=576, V=49152, where naive fits) and ``big`` (N=16384, H=896,
V=151936: Qwen2.5-0.5B's head on 8 × 2048 tokens). At ``big`` naive would need tens of GB, so it
is not run when its predicted peak would leave under 4 GB of ``MemAvailable``; its peak is then predicted
from a linear fit of measured naive peaks at two smaller N (same H, V), and said so in the output.

Usage:
  python benchmarks/bench_logprob.py --quick          # small shapes, a minute or two
  python benchmarks/bench_logprob.py                  # small + big (the big case takes long)
  python benchmarks/bench_logprob.py --cases small --sweep   # also time fused tile sizes
  python benchmarks/bench_logprob.py --cases small --profile # torch.profiler of one fused step
  python benchmarks/bench_logprob.py --smoke          # toy shapes, 1 sample each: measures nothing (the CI test)
Output: a table on stdout and ``benchmarks/out/bench_logprob.json``.
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import asdict, dataclass

from _common import (alternating_timings, available_memory_bytes, format_table,
                     interleaved_order, max_rss_bytes, run_isolated, summarise, timed, wait_for_memory,
                     write_json)

IMPLS = ("naive", "fused", "trl")
TRL_CHUNK_SIZE = 32768  # trl/trainer/utils.py: _CHUNKED_LOGPROB_CHUNK_SIZE in 1.16
GB = 1e9
SAFETY_MARGIN_BYTES = 4 * 10**9  # MemAvailable left to other users while naive runs


@dataclass(frozen=True)
class Case:
    name: str
    n: int
    h: int
    v: int
    repeats: int


CASES = {
    "small": Case("small", 2048, 576, 49152, 5),
    "big": Case("big", 16384, 896, 151936, 3),
}
QUICK_CASES = {
    "small": Case("small-quick", 1024, 256, 16384, 5),
    "big": Case("big-quick", 4096, 256, 65536, 5),
}
SMOKE_CASES = {
    "small": Case("small-smoke", 64, 32, 512, 1),
    "big": Case("big-smoke", 128, 32, 1024, 1),
}


def trl_available() -> bool:
    try:
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction  # noqa: F401
    except ImportError:
        return False
    return True


def _make_inputs(n: int, h: int, v: int, seed: int):
    """Inputs filled in place (no temporaries, so the RSS baseline is the steady state)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden = torch.empty(n, h).normal_(generator=gen).requires_grad_()
    # std 2/sqrt(H): logits of std ~2, entropies of a few nats, as in a trained LM head
    weight = torch.empty(v, h).normal_(0.0, 2.0 / h ** 0.5, generator=gen).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)
    cg = torch.randn(n, generator=gen)
    ce = torch.randn(n, generator=gen)
    return hidden, weight, targets, cg, ce


def _logprob_fn(impl: str, temperature: float, token_chunk: int | None, vocab_chunk: int | None):
    """``f(hidden, weight, targets) → (logp, entropy)`` for one implementation."""
    from arlopti.ops import logprobs as lp

    if impl in ("naive", "fused"):
        chunks = {"token_chunk": token_chunk or lp.DEFAULT_TOKEN_CHUNK,
                  "vocab_chunk": vocab_chunk or lp.DEFAULT_VOCAB_CHUNK}
        return lambda hid, w, t: lp.token_logprobs(hid, w, t, temperature, None, impl=impl, **chunks)
    if impl == "trl":
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction

        def trl_fn(hid, w, t):
            out = ChunkedLogProbFunction.apply(hid, w, None, t, temperature, TRL_CHUNK_SIZE, None, 1.0,
                                               ("entropy",))
            return out[0], out[1]
        return trl_fn
    raise ValueError(f"bench_logprob: unknown impl {impl!r}; use one of {IMPLS}")


def _step(fn, hidden, weight, targets, cg, ce) -> tuple[float, float, float, float]:
    """One forward + backward → ``(t_forward, t_backward, Σlogp, Σentropy)``."""
    t_f, (logp, ent) = timed(lambda: fn(hidden, weight, targets))
    loss = (logp * cg).sum() + (ent * ce).sum()
    t_b, _ = timed(loss.backward)
    return t_f, t_b, float(logp.detach().sum()), float(ent.detach().sum())


def measure(impl: str, n: int, h: int, v: int, temperature: float = 1.0, seed: int = 0,
            token_chunk: int | None = None, vocab_chunk: int | None = None) -> dict:
    """Child-process body: one fwd+bwd sample → time and RSS growth (call via ``run_isolated``)."""
    import torch

    fn = _logprob_fn(impl, temperature, token_chunk, vocab_chunk)
    _step(fn, *_make_inputs(64, h, 1024, seed + 1))  # first-call initialisation, tiny
    hidden, weight, targets, cg, ce = _make_inputs(n, h, v, seed)
    gc.collect()
    base = max_rss_bytes()
    t_f, t_b, s_lp, s_ent = _step(fn, hidden, weight, targets, cg, ce)
    peak = max_rss_bytes() - base
    return {"impl": impl, "n": n, "h": h, "v": v, "time_s": t_f + t_b, "forward_s": t_f, "backward_s": t_b,
            "peak_rss_delta_bytes": peak, "sum_logp": s_lp, "sum_entropy": s_ent,
            "threads": torch.get_num_threads()}


def naive_logits_bytes(n: int, v: int) -> int:
    """Size of one fp32 ``[N, V]`` tensor; naive keeps several alive at its peak."""
    return 4 * n * v


def rough_peak_bytes(impl: str, case: Case) -> float:
    """Generous a-priori peak (bytes) used only to wait for free memory before a sample."""
    from arlopti.ops.logprobs import DEFAULT_TOKEN_CHUNK, DEFAULT_VOCAB_CHUNK

    grads = 2 * 4 * (case.v * case.h + case.n * case.h)  # fp32 grads (+ a transient copy)
    if impl == "naive":
        return 10 * naive_logits_bytes(case.n, case.v) + grads
    if impl == "trl":  # its CPU path allocates ~10 temporaries of one 4096 x 32768 tile
        return 10 * 4 * min(case.n, 4096) * min(case.v, TRL_CHUNK_SIZE) + grads
    return 2 * 4 * min(case.n, DEFAULT_TOKEN_CHUNK) * min(case.v, DEFAULT_VOCAB_CHUNK) + grads


def predict_naive_peak(case: Case, temperature: float, fit_ns: tuple[int, int]) -> dict:
    """Measure naive at two smaller N (same H, V), fit ``peak = a + b·N`` and extrapolate."""
    pts = []
    for n in fit_ns:
        small = Case(case.name, n, case.h, case.v, 1)
        if not wait_for_memory(rough_peak_bytes("naive", small) + SAFETY_MARGIN_BYTES):
            raise RuntimeError(f"[{case.name}] naive fit at N={n}: not enough free memory for 30 min")
        pts.append(run_isolated(__file__, "measure", {"impl": "naive", "n": n, "h": case.h, "v": case.v,
                                                      "temperature": temperature}))
    (n0, p0), (n1, p1) = ((p["n"], p["peak_rss_delta_bytes"]) for p in pts)
    slope = (p1 - p0) / (n1 - n0)
    predicted = p0 + slope * (case.n - n0)
    return {"method": f"linear fit of measured naive peaks at N={n0},{n1} (same H, V)",
            "measured": {str(n0): p0, str(n1): p1},
            "bytes_per_token": slope, "logits_copies_at_peak": slope / (4 * case.v),
            "predicted_peak_bytes": predicted}


def run_case(case: Case, impls: list[str], temperature: float, log) -> dict:
    """Interleaved fresh-process samples of every implementation at one case."""
    result: dict = {"case": asdict(case), "impls": {}, "skipped": {}}
    run = list(impls)
    headroom = available_memory_bytes()
    # Only when naive might not fit (10 logits copies is a generous bound) is it predicted first.
    if "naive" in run and 10 * naive_logits_bytes(case.n, case.v) > headroom - SAFETY_MARGIN_BYTES:
        fit_ns = (max(case.n // 64, 64), max(case.n // 32, 128))
        estimate = predict_naive_peak(case, temperature, fit_ns)
        result["naive_estimate"] = estimate
        if estimate["predicted_peak_bytes"] > headroom - SAFETY_MARGIN_BYTES:
            run.remove("naive")
            result["skipped"]["naive"] = (
                f"predicted peak {estimate['predicted_peak_bytes'] / GB:.1f} GB would leave less than "
                f"{SAFETY_MARGIN_BYTES / GB:.0f} GB of MemAvailable ({headroom / GB:.1f} GB) to the "
                "others on this shared machine; peak reported as the prediction, time not measured")
            log(f"[{case.name}] naive skipped: {result['skipped']['naive']}")
    samples: dict[str, list[dict]] = {impl: [] for impl in run}
    need = {impl: rough_peak_bytes(impl, case) for impl in run}
    if "naive_estimate" in result:
        need["naive"] = result["naive_estimate"]["predicted_peak_bytes"]
    for i, impl in enumerate(interleaved_order(run, case.repeats)):
        if not wait_for_memory(need[impl] + SAFETY_MARGIN_BYTES, log=log):
            raise RuntimeError(f"[{case.name}] {impl}: MemAvailable stayed below {need[impl] / GB:.1f} GB "
                               f"+ {SAFETY_MARGIN_BYTES / GB:.0f} GB margin for 30 min; not risking an OOM")
        s = run_isolated(__file__, "measure", {"impl": impl, "n": case.n, "h": case.h, "v": case.v,
                                               "temperature": temperature})
        need[impl] = s["peak_rss_delta_bytes"]  # measured beats guessed
        samples[impl].append(s)
        log(f"[{case.name}] sample {i + 1}/{len(run) * case.repeats}: {impl} {s['time_s']:.2f} s, "
            f"peak +{s['peak_rss_delta_bytes'] / 2**20:.0f} MiB")
    for impl, ss in samples.items():
        result["impls"][impl] = {
            "time_s": summarise([s["time_s"] for s in ss]),
            "forward_s": summarise([s["forward_s"] for s in ss]),
            "backward_s": summarise([s["backward_s"] for s in ss]),
            "peak_rss_delta_bytes": summarise([s["peak_rss_delta_bytes"] for s in ss]),
            "sum_logp": ss[0]["sum_logp"], "sum_entropy": ss[0]["sum_entropy"],
        }
    return result


def _rows(case_result: dict) -> list[dict]:
    rows = []
    impls = case_result["impls"]
    c = case_result["case"]
    for impl in IMPLS:
        if impl in impls:
            r = impls[impl]
            rows.append({"case": c["name"], "impl": impl, "N": c["n"], "H": c["h"], "V": c["v"],
                         "time_s(med)": r["time_s"]["median"], "fwd_s": r["forward_s"]["median"],
                         "bwd_s": r["backward_s"]["median"], "n": r["time_s"]["n"],
                         "peak_MiB(med)": r["peak_rss_delta_bytes"]["median"] / 2**20,
                         "vs_fused_time": (r["time_s"]["median"] / impls["fused"]["time_s"]["median"]
                                           if "fused" in impls else None)})
        elif impl == "naive" and "naive_estimate" in case_result:
            est = case_result["naive_estimate"]["predicted_peak_bytes"]
            rows.append({"case": c["name"], "impl": "naive*", "N": c["n"], "H": c["h"], "V": c["v"],
                         "peak_MiB(med)": est / 2**20})
    return rows


def check_targets(case_result: dict) -> dict:
    """The task's acceptance targets, where the case has the numbers for them."""
    impls, out = case_result["impls"], {}
    if "fused" not in impls:
        return out
    f_mem = impls["fused"]["peak_rss_delta_bytes"]["median"]
    f_t = impls["fused"]["time_s"]["median"]
    if case_result["case"]["name"].startswith("big"):
        out["fused_peak_le_1GB"] = {"value_GB": f_mem / GB, "ok": f_mem <= 1.0 * GB}
    if "trl" in impls:
        t_mem = impls["trl"]["peak_rss_delta_bytes"]["median"]
        out["fused_peak_le_trl"] = {"fused_GB": f_mem / GB, "trl_GB": t_mem / GB, "ok": f_mem <= t_mem}
    if "naive" in impls:
        ratio = f_t / impls["naive"]["time_s"]["median"]
        out["fused_over_naive_time_le_1.3"] = {"ratio": ratio, "ok": ratio <= 1.3}
    for other in ("naive", "trl"):
        if other in impls:
            ref = impls[other]["sum_logp"]
            diff = abs(impls["fused"]["sum_logp"] - ref)
            out[f"sum_logp_rel_diff_vs_{other}"] = diff / max(abs(ref), 1e-30)
    return out


def sweep(case: Case, configs: list[tuple[int, int]], repeats: int, temperature: float) -> list[dict]:
    """In-process interleaved timing of fused tile sizes (memory of a tile pair is 8·tc·vc bytes)."""
    import torch  # noqa: F401

    hidden, weight, targets, cg, ce = _make_inputs(case.n, case.h, case.v, 0)

    def make(tc, vc):
        fn = _logprob_fn("fused", temperature, tc, vc)

        def go():
            _step(fn, hidden, weight, targets, cg, ce)
            hidden.grad = weight.grad = None
        return go

    fns = {f"{tc}x{vc}": make(tc, vc) for tc, vc in configs}
    times = alternating_timings(fns, repeats, warmup=1)
    return [{"tile": f"{tc}x{vc}", "time_s(med)": summarise(times[f"{tc}x{vc}"])["median"],
             "n": len(times[f"{tc}x{vc}"]), "tile_pair_MiB": 8 * tc * vc / 2**20} for tc, vc in configs]


def profile_fused(case: Case, temperature: float, row_limit: int = 15) -> str:
    """``torch.profiler`` table (self CPU time) of one fused forward + backward."""
    from torch.profiler import ProfilerActivity, profile

    hidden, weight, targets, cg, ce = _make_inputs(case.n, case.h, case.v, 0)
    fn = _logprob_fn("fused", temperature, None, None)
    _step(fn, hidden, weight, targets, cg, ce)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(fn, hidden, weight, targets, cg, ce)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="scaled-down shapes (a minute or two)")
    ap.add_argument("--smoke", action="store_true", help="toy shapes, one sample each: a check that it runs")
    ap.add_argument("--cases", default="small,big", help="comma list of: small, big")
    ap.add_argument("--impls", default="naive,fused,trl", help="comma list of: naive, fused, trl")
    ap.add_argument("--repeats", type=int, default=None,
                    help="samples per impl (default: per case, 5; 3 at big)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--sweep", action="store_true", help="also time fused tile sizes on the small case")
    ap.add_argument("--profile", action="store_true", help="also profile one fused step on the small case")
    ap.add_argument("--out", default="bench_logprob.json", help="file name under benchmarks/out/")
    args = ap.parse_args(argv)

    table = SMOKE_CASES if args.smoke else QUICK_CASES if args.quick else CASES
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in names:
        if c not in table:
            ap.error(f"--cases: unknown case {c!r}; use small and/or big")
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            ap.error(f"--impls: unknown impl {i!r}; use {', '.join(IMPLS)}")
    payload: dict = {"cases": {}, "notes": []}
    if "trl" in impls and not trl_available():
        impls.remove("trl")
        payload["notes"].append("trl not importable: install it with `pip install --no-deps trl==1.16.0`")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    rows = []
    for name in names:
        case = table[name]
        if args.repeats is not None:
            case = Case(case.name, case.n, case.h, case.v, args.repeats)
        res = run_case(case, impls, args.temperature, log)
        res["targets"] = check_targets(res)
        payload["cases"][case.name] = res
        rows += _rows(res)
    if args.sweep and "small" in names:
        case = table["small"]
        configs = [(512, 8192), (1024, 4096), (1024, 8192), (1024, 16384), (2048, 8192), (4096, 8192)]
        payload["sweep"] = sweep(case, configs, args.repeats or 3, args.temperature)
    if args.profile and "small" in names:
        payload["profile_fused"] = profile_fused(table["small"], args.temperature)

    print(format_table(rows, ["case", "impl", "N", "H", "V", "time_s(med)", "fwd_s", "bwd_s", "n",
                              "peak_MiB(med)", "vs_fused_time"]))
    for name, res in payload["cases"].items():
        for key, why in res["skipped"].items():
            print(f"{name}: {key}* = predicted, not run: {why}")
        print(f"{name} targets: {res['targets']}")
    if "sweep" in payload:
        print(format_table(payload["sweep"], ["tile", "time_s(med)", "n", "tile_pair_MiB"]))
    if "profile_fused" in payload:
        print(payload["profile_fused"])
    for note in payload["notes"]:
        print("note:", note)
    print("wrote", write_json(args.out, payload))


if __name__ == "__main__":
    main()
