"""How one update's cost grows with the response length and the group size (SmolLM2-135M, fp32).

Workload: SmolLM2-135M-Instruct (offline, ``arlopti.models.loading``), one prompt × ``G`` responses of
exactly ``L`` tokens from a fixed rollout engine (no generation), β = 0.04 (so a reference
log-prob pass runs), π_old reused from the first training forward, one mini-batch of all ``G``
responses (one AdamW step), micro-batches of 4 (training and log-prob passes), fused
log-probs. Measured per step: the learner's own timers ``timing/logprobs_s`` (reference pass)
+ ``timing/update_s`` (training forward/backward of every micro-batch + AdamW), and the
process's peak-RSS growth over its baseline taken after the policy is built, before the first
step (``ru_maxrss``, one fresh process per size: :func:`_common.run_isolated`). That growth
includes a size-independent part (gradients, AdamW moments, the reference model: ≈ 2 GiB at
135 M fp32 parameters) on top of the activations, which are what grows with the size.

Sweeps: ``L`` = 128, 256, 512, 1024 at ``G`` = 8; ``G`` = 4, 8, 16 at ``L`` = 256.
Exponent: least-squares slope of ``log(time)`` on ``log(response tokens)`` within each sweep,
and the attention share predicted by the FLOP model ``6·N_body·T + 6·V·H·T_resp +
12·n_layers·H·Σ S²`` (as in ``bench_mfu``): the last term grows with ``S²`` per row, so
doubling ``L`` more than doubles the cost, while doubling ``G`` (more rows of the same
length) only doubles it.

Usage (each size can run in its own invocation; results merge into one JSON):
  python benchmarks/bench_scaling.py --sizes 128x8,256x8            # L x G pairs
  python benchmarks/bench_scaling.py --plot                         # fit + PNG from the JSON
  python benchmarks/bench_scaling.py --smoke                        # the tiny model at 8x2: measures nothing
Output: ``benchmarks/out/bench_scaling.json``; ``--plot`` writes ``benchmarks/bench_scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

import _common
from _common import bench_datamodule, fit_steps, fixed_length_engine, format_table, max_rss_bytes, \
    run_isolated, write_json

MODEL = "smollm2-135m-instruct"
JSON_NAME = "bench_scaling.json"
PNG = Path(__file__).resolve().parent / "bench_scaling.png"
LENGTHS, LENGTH_GROUP = (128, 256, 512, 1024), 8
GROUPS, GROUP_LENGTH = (4, 8, 16), 256
MIB = 2**20


def run_size(length: int, group: int, warmup: int, steps: int, model: str = MODEL) -> dict:
    """Child: ``warmup + steps`` updates at response length ``length`` and group size ``group``."""
    warnings.filterwarnings("ignore")
    import torch

    from arlopti.config import AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import load_tokenizer

    torch.set_num_threads(2)
    tok = load_tokenizer(model)
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.04), optim=OptimConfig(lr=1e-6),
                    sizes=SizesConfig(prompts_per_step=1, group_size=group, mini_batch_size=group,
                                      micro_batch_size=min(4, group), logprob_micro_batch_size=4),
                    model=ModelConfig(name_or_path=model, logprob_impl="fused"),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=length))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=warmup + steps)
    module.rollout_engine = fixed_length_engine(tok, lambda i, j: length)
    base = max_rss_bytes()
    out = fit_steps(module, bench_datamodule(tok, 1, warmup + steps), group)
    hf = module.policy.hf
    c = hf.config
    n_params = sum(p.numel() for p in hf.parameters())
    n_body = n_params - hf.get_input_embeddings().weight.numel()
    p_len = module.last_step_context.experience.prompt_len
    s_row = p_len + length
    flops = {"body": 6 * n_body * group * s_row, "head": 6 * c.vocab_size * c.hidden_size * group * length,
             "attention": 12 * c.num_hidden_layers * c.hidden_size * group * s_row**2}
    timed = out[warmup:]
    return {"length": length, "group": group, "prompt_len": p_len, "response_tokens": group * length,
            "logprobs_s": [m["timing/logprobs_s"] for m in timed], "update_s": [m["timing/update_s"] for m in timed],
            "peak_rss_delta": max_rss_bytes() - base, "flops": flops, "params": n_params}


def _load(name: str = JSON_NAME) -> dict:
    path = _common.OUT_DIR / name  # read now: the smoke tests point it elsewhere
    return json.loads(path.read_text()).get("sizes", {}) if path.exists() else {}


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``log y`` on ``log x`` (the exponent ``b`` of ``y ∝ x^b``)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def _row(r: dict) -> dict:
    t = statistics.median(a + b for a, b in zip(r["logprobs_s"], r["update_s"]))
    f = r["flops"]
    return {"L": r["length"], "G": r["group"], "resp_tokens": r["response_tokens"], "time_s": t,
            "ms_per_resp_token": 1e3 * t / r["response_tokens"], "peak_rss_delta_mib": r["peak_rss_delta"] / MIB,
            "attn_flop_share": f["attention"] / sum(f.values()), "n": len(r["update_s"])}


def report(make_plot: bool, json_name: str = JSON_NAME) -> int:
    sizes = _load(json_name)
    rows = sorted((_row(r) for r in sizes.values()), key=lambda r: (r["G"], r["L"]))
    print(format_table(rows, ["L", "G", "resp_tokens", "time_s", "ms_per_resp_token", "peak_rss_delta_mib",
                              "attn_flop_share", "n"]))
    fits = {}
    for name, sel, key in (("length", lambda r: r["G"] == LENGTH_GROUP, "L"),
                           ("group", lambda r: r["L"] == GROUP_LENGTH, "G")):
        pts = sorted((r for r in rows if sel(r)), key=lambda r: r[key])
        if len(pts) >= 2:
            xs = [r["resp_tokens"] for r in pts]
            fits[name] = {"time_exponent": slope(xs, [r["time_s"] for r in pts]),
                          "memory_exponent": slope(xs, [max(r["peak_rss_delta_mib"], 1e-3) for r in pts]),
                          "points": [r[key] for r in pts]}
            print(f"{name} sweep ({key} = {fits[name]['points']}): time ∝ tokens^{fits[name]['time_exponent']:.3f}, "
                  f"peak RSS growth ∝ tokens^{fits[name]['memory_exponent']:.3f}")
    if make_plot and rows:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for name, sel, key, mark in (("L sweep (G = 8)", lambda r: r["G"] == LENGTH_GROUP, "L", "o-"),
                                     ("G sweep (L = 256)", lambda r: r["L"] == GROUP_LENGTH, "G", "s--")):
            pts = sorted((r for r in rows if sel(r)), key=lambda r: r["resp_tokens"])
            xs = [r["resp_tokens"] for r in pts]
            axes[0].plot(xs, [r["ms_per_resp_token"] for r in pts], mark, label=name)
            axes[1].plot(xs, [r["peak_rss_delta_mib"] for r in pts], mark, label=name)
        for ax, ylabel in zip(axes, ("ms per response token (ref log-probs + update)", "peak RSS growth (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("response tokens per update (G × L)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.suptitle("SmolLM2-135M, fp32, 2 CPU threads: one update (benchmarks/bench_scaling.py)")
        fig.tight_layout()
        fig.savefig(PNG, dpi=100)
        print(f"wrote {PNG}")
    write_json(json_name, {"sizes": sizes, "fits": fits})
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=None,
                    help="comma-separated LxG pairs to run (default: every size of both sweeps)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--plot", action="store_true", help="only fit and plot what the JSON holds")
    ap.add_argument("--model", default=MODEL, help="smollm2-135m-instruct, or tiny (the random test model)")
    ap.add_argument("--smoke", action="store_true", help="the tiny model at 8x2, no warm-up, 1 step: measures nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.sizes, args.warmup, args.steps = "tiny", "8x2", 0, 1
    name = "bench_scaling_smoke.json" if args.smoke else JSON_NAME  # never merged into the real sweep
    if args.plot:
        return report(True, name)
    if args.sizes:
        todo = [tuple(int(x) for x in s.lower().split("x")) for s in args.sizes.split(",")]
    else:
        todo = sorted({(L, LENGTH_GROUP) for L in LENGTHS} | {(GROUP_LENGTH, G) for G in GROUPS})
    here = Path(__file__).resolve()
    for length, group in todo:
        res = run_isolated(here, run_size.__name__, {"length": length, "group": group, "warmup": args.warmup,
                                                     "steps": args.steps, "model": args.model}, timeout_s=3600)
        sizes = _load(name)
        sizes[f"{length}x{group}"] = res
        write_json(name, {"sizes": sizes})
        print(f"L={length} G={group}: ref log-probs {res['logprobs_s']} s, update {res['update_s']} s, "
              f"peak RSS +{res['peak_rss_delta'] / MIB:.0f} MiB", flush=True)
    return report(False, name)


if __name__ == "__main__":
    sys.exit(main())
