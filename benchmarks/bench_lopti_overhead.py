"""Lopti against GRPO on the same batches: update phase alone and end to end.

Both configurations start from the same tiny Qwen2 weights (saved to a temp dir) and see the
same rollouts: HF ``generate`` with the same per-step sampling seeds and
``min_new_tokens = max_new_tokens`` (fixed length), so step ``k``'s batch is identical as long
as the sampled tokens do not depend on the tiny weight change (lr 1e-6): checked, the script
compares the response token ids of both configurations step by step and reports
``same_batches``.

* **update phase** = ``timing/logprobs_s + timing/update_s`` of the learner: the no-grad
  old / reference passes, both Lopti phases (or GRPO's one), backward, optimizer steps.
* **end to end** = wall time of the whole rollout step (generation, scoring, update).

GRPO: one optimizer step per rollout step. Lopti (η chosen so both phases have tokens on the
random model, whose p_old is around 1/vocab): a low-phase step, then a high-phase step, each a
forward/backward over the mini-batch; the low phase reuses its forward as π_old, so neither
configuration runs a separate old-log-prob pass. Configurations alternate fit by fit
(GRPO, Lopti, Lopti, GRPO, ...); each fit = 1 untimed warm-up step + ``--steps`` timed steps;
medians over all timed steps.

Usage:
  python benchmarks/bench_lopti_overhead.py --quick
  python benchmarks/bench_lopti_overhead.py
  python benchmarks/bench_lopti_overhead.py --smoke    # the smallest size, measuring nothing (the CI test)
Output: a table on stdout and ``benchmarks/out/bench_lopti_overhead.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import warnings

from _common import bench_datamodule, fit_steps, format_table, interleaved_order, saved_tiny_model, write_json

PROMPTS, GROUP, MAX_NEW = 4, 4, 96
ETA = 0.002


def make_module(model_dir: str, tok, lopti: bool, steps: int, prompts: int = PROMPTS, max_new: int = MAX_NEW):
    from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)
    from arlopti.learner.module import GRPOModule

    n = prompts * GROUP
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.04, lopti=LoptiConfig(enabled=lopti, eta=ETA)),
                    optim=OptimConfig(lr=1e-6),
                    sizes=SizesConfig(prompts_per_step=prompts, group_size=GROUP, mini_batch_size=n,
                                      micro_batch_size=min(8, n), logprob_micro_batch_size=n),
                    model=ModelConfig(name_or_path=model_dir),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=max_new, generation_batch_size=n))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.policy.hf.generation_config.min_new_tokens = max_new
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None, help="fits per configuration")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per fit")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest size (hidden 32 x 1 layer, 2 prompts x 4, 8 tokens, 1 fit of 1 step each)")
    ap.add_argument("--out", default="bench_lopti_overhead.json", help="file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    prompts, max_new = PROMPTS, MAX_NEW
    if args.smoke:
        args.rounds, args.steps, args.hidden, args.layers, prompts, max_new = 1, 1, 32, 1, 2, 8
    rounds = args.rounds or (1 if args.quick else 2)
    steps = args.steps or (3 if args.quick else 3)
    warnings.filterwarnings("ignore")
    import torch

    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    samples: dict[str, list[dict]] = {"grpo": [], "lopti": []}
    batches: dict[str, list[str]] = {"grpo": [], "lopti": []}
    with saved_tiny_model(tok, args.hidden, args.layers) as (model_dir, n_params):
        for name in interleaved_order(["grpo", "lopti"], rounds):
            module = make_module(model_dir, tok, name == "lopti", steps + 1, prompts, max_new)
            hashes: list[str] = []
            orig = module.training_step

            def spy(batch, idx, _orig=orig, _h=hashes):
                ids = batch.experience.input_ids
                _h.append(hashlib.blake2b(ids.numpy().tobytes(), digest_size=8).hexdigest())
                return _orig(batch, idx)

            module.training_step = spy
            out = fit_steps(module, bench_datamodule(tok, prompts, steps + 1), GROUP)
            samples[name] += out[1:]
            batches[name] = hashes
            print(f"  {name}: update {[round(m['timing/logprobs_s'] + m['timing/update_s'], 3) for m in out[1:]]} s,"
                  f" step {[round(m['step_s'], 3) for m in out[1:]]} s", flush=True)

    rows, summary = [], {}
    for name, ms in samples.items():
        upd = [m["timing/logprobs_s"] + m["timing/update_s"] for m in ms]
        summary[name] = {"update_s": statistics.median(upd), "end_to_end_s": statistics.median(m["step_s"] for m in ms),
                         "rollout_s": statistics.median(m["timing/rollout_s"] for m in ms),
                         "n": len(ms),  # update/steps: every optimizer step (update/low|high/steps: per phase)
                         "optimizer_steps_per_rollout": statistics.median(m["update/steps"] for m in ms)}
        if name == "lopti":
            summary[name]["low_token_frac"] = statistics.median(
                m["lopti/low_tokens"] / max(1.0, m["lopti/low_tokens"] + m["lopti/high_tokens"]) for m in ms)
        rows.append({"config": name, **summary[name]})
    ratios = {"update_lopti_over_grpo": summary["lopti"]["update_s"] / summary["grpo"]["update_s"],
              "end_to_end_lopti_over_grpo": summary["lopti"]["end_to_end_s"] / summary["grpo"]["end_to_end_s"]}
    same = batches["grpo"] == batches["lopti"]
    print(f"tiny Qwen2 hidden {args.hidden} x {args.layers} layers ({n_params:,} params), {prompts} prompts x "
          f"{GROUP}, {max_new} tokens, eta {ETA}")
    print(format_table(rows, ["config", "update_s", "end_to_end_s", "rollout_s", "n", "optimizer_steps_per_rollout",
                              "low_token_frac"]))
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    print(f"same_batches (last fit of each, step by step): {same}")
    path = write_json(args.out, {"summary": summary, "ratios": ratios, "same_batches": same,
                                                    "params": n_params})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
