"""Achieved FLOP/s of our policy update as a share of this machine's measured matmul peak.

Workload: SmolLM2-135M-Instruct (offline, ``arlopti.models.loading``), ``--responses`` responses of
exactly ``--length`` tokens from a fixed rollout engine, one mini-batch, micro-batches of
``--mbs``, β = 0 and the first forward reused as π_old, so the learner's ``timing/update_s``
is the training forward + backward of every micro-batch plus one AdamW step. Precision
``--precision`` (default ``bf16-mixed``: fp32 master weights, bf16 autocast matmuls).

FLOPs of one update (fwd + bwd = 3 × forward; a multiply-add = 2 FLOPs):

    6 · N_body · T  +  6 · V · H · T_resp  +  12 · L · H · Σ_rows S²

with ``N_body`` the non-embedding parameters, ``T`` all (prompt + response) positions of the
micro-batches, ``T_resp`` the response positions (the LM head runs on those only, fused
log-probs), ``L`` layers, ``H`` hidden size, ``S`` the padded row length (attention scores and
values, counted full, not causal-halved). ``6 · params · tokens`` over all tokens is also
printed (the textbook estimate).

Peak: the best of ``--gemm-reps`` timings of an ``n × n × n`` matmul (``--gemm``) in bf16
and in fp32, in the same process just before the updates; ``mfu`` uses the peak of the
update's matmul dtype (bf16 under bf16-mixed), ``vs_fp32_peak`` the fp32 one. Both precisions
run by default (``--precisions``): on CPUs without native bf16 matmul (no AVX512-BF16 / AMX)
the bf16 GEMM is an order of magnitude slower than fp32, which this benchmark makes visible.

Usage:
  python benchmarks/bench_mfu.py --quick          # fp32 only, 1 timed step
  python benchmarks/bench_mfu.py [--profile]      # fp32 and bf16-mixed
Output: a table on stdout and ``benchmarks/out/bench_mfu.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

from _common import bench_datamodule, fit_steps, fixed_length_engine, format_table, gemm_rate, write_json

GROUP = 4
MODEL = "smollm2-135m-instruct"


def run_precision(precision: str, args, tok, peaks: dict) -> tuple[dict, str | None]:
    """One fit of ``args.warmup + args.steps`` (+1 profiled) update steps at ``precision`` → table row."""
    import torch  # noqa: F401

    from arlopti.config import AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule

    prompts = args.responses // GROUP
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.0), optim=OptimConfig(lr=1e-6),
                    sizes=SizesConfig(prompts_per_step=prompts, group_size=GROUP, mini_batch_size=args.responses,
                                      micro_batch_size=args.mbs, logprob_micro_batch_size=args.responses),
                    model=ModelConfig(name_or_path=MODEL),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=args.length))
    n_steps = args.warmup + args.steps + (1 if args.profile else 0)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=n_steps)
    module.rollout_engine = fixed_length_engine(tok, lambda i, j: args.length)
    hf = module.policy.hf
    c = hf.config
    n_params = sum(p.numel() for p in hf.parameters())
    n_body = n_params - hf.get_input_embeddings().weight.numel()  # tied head: counted in the head term
    if not c.tie_word_embeddings:
        n_body -= hf.get_output_embeddings().weight.numel()
    prof_holder: dict = {}
    if args.profile:
        orig = module.training_step
        last = n_steps - 1

        def profiled(batch, idx, _orig=orig):
            if idx < last:
                return _orig(batch, idx)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                r = _orig(batch, idx)
            prof_holder["table"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            return r

        module.training_step = profiled
    out = fit_steps(module, bench_datamodule(tok, prompts, n_steps), GROUP, precision=precision)
    timed = out[args.warmup:args.warmup + args.steps]
    p_len = module.last_step_context.experience.prompt_len
    s_row = p_len + args.length
    t_all, t_resp = args.responses * s_row, args.responses * args.length
    flops = (6 * n_body * t_all + 6 * c.vocab_size * c.hidden_size * t_resp
             + 12 * c.num_hidden_layers * c.hidden_size * args.responses * s_row**2)
    upd = statistics.median(m["timing/update_s"] for m in timed)
    mm = "bf16" if precision == "bf16-mixed" else "fp32"
    row = {"precision": precision, "update_s": upd, "tokens": t_all, "model_gflop": flops / 1e9,
           "achieved_gflops": flops / upd / 1e9, "peak_gflops": peaks[mm] / 1e9, "mfu": flops / upd / peaks[mm],
           "mfu_6NT": 6 * n_params * t_all / upd / peaks[mm],
           "vs_fp32_peak": flops / upd / peaks["fp32"], "n": len(timed),
           "samples": [m["timing/update_s"] for m in timed], "params": n_params, "prompt_len": p_len}
    return row, prof_holder.get("table")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fp32 only, 1 timed step")
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--responses", type=int, default=8)
    ap.add_argument("--length", type=int, default=64, help="response tokens")
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (after the warm-up)")
    ap.add_argument("--gemm", type=int, default=1024)
    ap.add_argument("--gemm-reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="torch.profiler of one more update per precision")
    ap.add_argument("--out", default="bench_mfu.json", help="file name under benchmarks/out/")
    args = ap.parse_args(argv)
    args.steps = args.steps or (1 if args.quick else 3)
    precisions = ["32-true"] if args.quick else [p.strip() for p in args.precisions.split(",") if p.strip()]
    warnings.filterwarnings("ignore")
    import torch

    from arlopti.models.loading import load_tokenizer

    tok = load_tokenizer(MODEL)
    peaks = {"bf16": gemm_rate(args.gemm, torch.bfloat16, args.gemm_reps),
             "fp32": gemm_rate(args.gemm, torch.float32, args.gemm_reps)}
    print(f"GEMM {args.gemm}^3 best of {args.gemm_reps}: bf16 {peaks['bf16'] / 1e9:.2f} GFLOP/s, "
          f"fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s", flush=True)
    rows, profiles = [], {}
    for prec in precisions:
        row, table = run_precision(prec, args, tok, peaks)
        rows.append(row)
        profiles[prec] = table
        print(f"  {prec}: update {[round(x, 2) for x in row['samples']]} s", flush=True)
    print(f"{MODEL}: {rows[0]['params']:,} params, {args.responses} x ({rows[0]['prompt_len']} prompt + "
          f"{args.length} response) tokens, micro-batches of {args.mbs}, beta 0, AdamW")
    cols = ["precision", "update_s", "tokens", "model_gflop", "achieved_gflops", "peak_gflops", "mfu", "mfu_6NT",
            "vs_fp32_peak", "n"]
    print(format_table(rows, cols))
    for r in rows:
        print(f"mfu[{r['precision']}]: {r['mfu']:.3f} of the measured GEMM peak of its matmul dtype; "
              f"{r['vs_fp32_peak']:.3f} of the fp32 peak")
    for prec, table in profiles.items():
        if table:
            print(f"profile ({prec}, one update, self CPU time):\n{table}")
    path = write_json(args.out, {"results": rows, "peaks_flops": peaks, "profiles": profiles})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
