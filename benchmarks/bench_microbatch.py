"""Token-budget against fixed-size micro-batches on a realistic length spread (responses of 50-1000 tokens).

Same batches for both: a fixed rollout engine (``_common.fixed_length_engine``) gives every
response a length drawn uniformly from [50, 1000] (seeded by prompt and sample), the same
in every run; the same tiny Qwen2 weights. One mini-batch of ``--responses`` responses, β = 0
(no reference pass) and the first forward reused as π_old (no old pass), so the learner's time
is the micro-batched training forward/backward plus the optimizer step.

* ``fixed``: ``sizes.micro_batch_size = --mbs`` rows in row order, each padded to its
  longest response;
* ``budget``: ``sizes.micro_batch_tokens = mbs × (P + 1000)``, the padded-token bound of one
  fixed micro-batch in the worst case (same peak-activation budget), packed longest first
  (``arlopti.learner.microbatch``).

Reported: ``update/valid_token_frac`` (real tokens / padded tokens of the training forwards),
micro-batches per step, ``timing/update_s`` (median over timed steps; fits alternate fixed,
budget, budget, fixed, ...; 1 untimed warm-up step per fit).

Usage:
  python benchmarks/bench_microbatch.py --quick
  python benchmarks/bench_microbatch.py
  python benchmarks/bench_microbatch.py --smoke    # the smallest size, measuring nothing (the CI test)
Output: a table on stdout and ``benchmarks/out/bench_microbatch.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import warnings

from _common import (bench_datamodule, fit_steps, fixed_length_engine, format_table,
                     interleaved_order, write_json)

MIN_LEN, MAX_LEN = 50, 1000
GROUP = 4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--responses", type=int, default=None, help="responses per step (one mini-batch)")
    ap.add_argument("--mbs", type=int, default=4, help="fixed micro_batch_size")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest size (4 responses of 8-24 tokens, hidden 32 x 1 layer, 1 fit of 1 step each)")
    ap.add_argument("--out", default="bench_microbatch.json", help="file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    min_len, max_len = MIN_LEN, MAX_LEN
    if args.smoke:
        args.responses, args.rounds, args.steps, args.hidden, args.layers, args.mbs = 4, 1, 1, 32, 1, 2
        min_len, max_len = 8, 24
    n = args.responses or (16 if args.quick else 32)
    rounds = args.rounds or (1 if args.quick else 2)
    steps = args.steps or (2 if args.quick else 3)
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401

    from arlopti.config import AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    prompts = n // GROUP

    samples: dict[str, list[dict]] = {"fixed": [], "budget": []}
    budget_tokens = None
    for name in interleaved_order(["fixed", "budget"], rounds):
        dm = bench_datamodule(tok, prompts, steps + 1)
        # prompt length P of the batches (all prompts tokenise alike up to the index digits)
        p_len = max(len(tok(f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?")["input_ids"])
                    for i in range(prompts * (steps + 1)))
        budget_tokens = args.mbs * (p_len + max_len)
        sizes = dict(prompts_per_step=prompts, group_size=GROUP, mini_batch_size=n, logprob_micro_batch_size=8)
        if name == "fixed":
            sizes["micro_batch_size"] = args.mbs
        else:
            sizes.update(micro_batch_size=1, micro_batch_tokens=budget_tokens)
        cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.0), optim=OptimConfig(lr=1e-6),
                        sizes=SizesConfig(**sizes), model=ModelConfig(name_or_path="tiny", tiny=_tiny(args)),
                        rollout=RolloutConfig(temperature=1.0, max_new_tokens=max_len))
        module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps + 1)
        module.rollout_engine = fixed_length_engine(
            tok, lambda i, j: random.Random(f"len/{i}/{j}").randint(min_len, max_len))
        out = fit_steps(module, dm, GROUP)
        samples[name] += out[1:]
        print(f"  {name}: update {[round(m['timing/update_s'], 2) for m in out[1:]]} s, valid frac "
              f"{out[-1]['update/valid_token_frac']:.3f}, micro-batches {out[-1]['update/micro_batches']:.0f}",
              flush=True)

    rows, summary = [], {}
    for name, ms in samples.items():
        summary[name] = {"update_s": statistics.median(m["timing/update_s"] for m in ms),
                         "valid_token_frac": statistics.median(m["update/valid_token_frac"] for m in ms),
                         "micro_batches": statistics.median(m["update/micro_batches"] for m in ms),
                         "n": len(ms)}
        rows.append({"config": name, **summary[name]})
    ratios = {"update_time_budget_over_fixed": summary["budget"]["update_s"] / summary["fixed"]["update_s"]}
    print(f"{n} responses of {min_len}-{max_len} tokens; fixed micro_batch_size={args.mbs}; "
          f"budget micro_batch_tokens={budget_tokens}; tiny Qwen2 hidden {args.hidden} x {args.layers}")
    print(format_table(rows, ["config", "update_s", "valid_token_frac", "micro_batches", "n"]))
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    path = write_json(args.out, {"summary": summary, "ratios": ratios, "budget": budget_tokens,
                                                "responses": n, "fixed_mbs": args.mbs})
    print(f"wrote {path}")
    return 0


def _tiny(args):
    from arlopti.config import TinyModelConfig

    return TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, intermediate_size=2 * args.hidden)


if __name__ == "__main__":
    sys.exit(main())
