"""What reusing the first optimizer step's forward as logπ_old saves (issue 53): ``reuse_old_logprobs`` on / off.

``GRPOModule.reuse_old_logprobs = True`` takes the first optimizer step's old log-probs from that step's own
training forward, so its rows skip the separate no-grad old-log-prob pass
(``learner/policy.py::old_and_ref_log_probs``). This script times the learner's update phase with the reuse
on and off, on the same batches, for three shapes (the demo's, ``configs/experiment/kk_lopti_demo.yaml``:
β = 0 so no reference pass, one mini-batch = the whole batch, micro-batch = mini-batch / 2, the old pass
in one chunk of the whole batch, 128-token completions; the batch scaled to the tiny model):

* ``grpo_1mb``: GRPO, one mini-batch: the reuse skips the whole old pass;
* ``lopti_1mb``: Lopti (low phase, then high phase), one mini-batch: the low phase's forward is π_old;
* ``grpo_4mb``: GRPO, 4 mini-batches (mini-batch = batch / 4): the reuse covers the first one's rows only.

**Measured**: per rollout step, the learner's ``timing/logprobs_s + timing/update_s`` (the no-grad old pass,
the advantages, every forward/backward and optimizer step); per shape, per round, the ratio of the on fit's
median to the off fit's median, then the median and min-max of those ratios over the rounds (n = rounds).
Configurations run fit by fit, interleaved (``_common.interleaved_order``: each round runs every one once,
the start rotating); each fit = 1 untimed warm-up step + ``--steps`` timed steps. Also reported:
``update/old_logprobs_reused_frac`` per configuration, whether on and off saw the same batches (response
token ids hashed step by step), the max abs difference of the final weights of on and off (equal up to
float rounding, not bit for bit) beside the largest weight change of the run, the fp32 1024³ GEMM rate and
the read bandwidth before and after the timed fits, and ``machine_info()``.

Set-up as ``bench_lopti_overhead``: tiny random Qwen2 saved to a temp dir, HF ``generate`` rollouts with
fixed-length completions (``min_new_tokens = max_new_tokens``) and per-step sampling seeds, fp32 on CPU.

Usage:
  python benchmarks/bench_old_logprob_reuse.py            # 8 rounds x 3 timed steps
  python benchmarks/bench_old_logprob_reuse.py --quick    # 2 rounds x 2 timed steps
  python benchmarks/bench_old_logprob_reuse.py --smoke    # the smallest size, measuring nothing (the CI test)
Output: a table on stdout and ``benchmarks/out/bench_old_logprob_reuse.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import warnings

from _common import (bench_datamodule, fit_steps, format_table, gemm_rate, interleaved_order, read_bandwidth,
                     saved_tiny_model, summarise, write_json)

GROUP = 4
ETA = 0.002  # the random model's p_old is around 1/vocab (491): both Lopti phases get tokens
LR = 3e-5    # the demo's
SHAPES = {"grpo_1mb": (False, 1), "lopti_1mb": (True, 1), "grpo_4mb": (False, 4)}  # (lopti, mini-batches)


def make_module(model_dir: str, tok, lopti: bool, n_minis: int, reuse: bool, steps: int, prompts: int, max_new: int):
    """The learner at the demo's proportions: batch ``prompts x GROUP``, mini-batch = batch / ``n_minis``,
    micro-batch = mini-batch / 2, old pass in one chunk; ``reuse_old_logprobs`` set on the instance."""
    from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)
    from arlopti.learner.module import GRPOModule

    n = prompts * GROUP
    mini = n // n_minis
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.0, lopti=LoptiConfig(enabled=lopti, eta=ETA)),
                    optim=OptimConfig(lr=LR),
                    sizes=SizesConfig(prompts_per_step=prompts, group_size=GROUP, mini_batch_size=mini,
                                      micro_batch_size=max(1, mini // 2), logprob_micro_batch_size=n),
                    model=ModelConfig(name_or_path=model_dir),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=max_new, generation_batch_size=n))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.reuse_old_logprobs = reuse
    module.policy.hf.generation_config.min_new_tokens = max_new
    return module


def one_fit(model_dir: str, tok, name: str, steps: int, prompts: int, max_new: int) -> dict:
    """Fit configuration ``name`` (``<shape>_on|off``) for 1 + ``steps`` rollout steps: its timed steps'
    metrics, the response-id hash of every step, and its final weights (flat, fp32)."""
    import torch

    shape, reuse = name.rsplit("_", 1)
    lopti, n_minis = SHAPES[shape]
    module = make_module(model_dir, tok, lopti, n_minis, reuse == "on", steps + 1, prompts, max_new)
    hashes: list[str] = []
    orig = module.training_step

    def spy(batch, idx, _orig=orig):
        ids = batch.experience.input_ids
        hashes.append(hashlib.blake2b(ids.numpy().tobytes(), digest_size=8).hexdigest())
        return _orig(batch, idx)

    module.training_step = spy
    flat = lambda: torch.cat([p.detach().flatten().float() for p in module.policy.hf.parameters()]).clone()  # noqa: E731
    before = flat()
    out = fit_steps(module, bench_datamodule(tok, prompts, steps + 1), GROUP)
    weights = flat()
    return {"metrics": out[1:], "hashes": hashes, "weights": weights, "change": float((weights - before).abs().max())}


def update_s(m: dict) -> float:
    return m["timing/logprobs_s"] + m["timing/update_s"]


def machine_rates(smoke: bool) -> dict:
    """fp32 1024³ GEMM GFLOP/s and read GB/s (a 1 GiB tensor); tiny sizes under ``--smoke``."""
    import torch

    n, mib, reps = (64, 8, 1) if smoke else (1024, 1024, 5)
    return {"gemm_fp32_gflops": gemm_rate(n, torch.float32, reps) / 1e9, "read_gb_s": read_bandwidth(mib, reps) / 1e9}


def run_fits(args, model_dir: str, tok, prompts: int, max_new: int) -> tuple[dict, dict]:
    """Every configuration ``args.rounds`` times, interleaved. Returns (per-config fits' results without
    weights, per-shape per-round weight comparisons)."""
    names = [f"{shape}_{r}" for shape in SHAPES for r in ("on", "off")]
    fits: dict[str, list[dict]] = {n: [] for n in names}
    weights: dict[str, dict] = {s: {"max_abs_diff": [], "max_abs_change": [], "same_batches": []} for s in SHAPES}
    last: dict[str, dict] = {}
    for i, name in enumerate(interleaved_order(names, args.rounds)):
        res = one_fit(model_dir, tok, name, args.steps, prompts, max_new)
        w = res.pop("weights")
        fits[name].append(res)
        last[name] = {"w": w, "hashes": res["hashes"], "change": res["change"]}
        print(f"  {name}: update {[round(update_s(m), 3) for m in res['metrics']]} s, reused_frac "
              f"{[m['update/old_logprobs_reused_frac'] for m in res['metrics']]}", flush=True)
        if (i + 1) % len(names) == 0:  # a round is over: compare on with off, shape by shape
            for shape in SHAPES:
                on, off = last[f"{shape}_on"], last[f"{shape}_off"]
                weights[shape]["max_abs_diff"].append(float((on["w"] - off["w"]).abs().max()))
                weights[shape]["max_abs_change"].append(max(on["change"], off["change"]))
                weights[shape]["same_batches"].append(on["hashes"] == off["hashes"])
    return fits, weights


def summarise_fits(fits: dict, weights: dict) -> tuple[dict, dict, list[dict]]:
    """Per configuration: update seconds (summarise over every timed step), reused fraction, optimizer
    steps; per shape: the paired per-round ratios on / off, and the weight check. Returns (summary,
    ratios, table rows)."""
    summary, ratios, rows = {}, {}, []
    for name, runs in fits.items():
        ms = [m for r in runs for m in r["metrics"]]
        summary[name] = {"update_s": summarise([update_s(m) for m in ms]),
                         "logprobs_s": statistics.median(m["timing/logprobs_s"] for m in ms),
                         "old_logprobs_reused_frac": statistics.median(m["update/old_logprobs_reused_frac"] for m in ms),
                         "optimizer_steps_per_rollout": statistics.median(m["update/steps"] for m in ms),
                         "fit_medians_s": [statistics.median(update_s(m) for m in r["metrics"]) for r in runs]}
    for shape in SHAPES:
        on, off = summary[f"{shape}_on"]["fit_medians_s"], summary[f"{shape}_off"]["fit_medians_s"]
        per_round = [a / b for a, b in zip(on, off)]
        w = weights[shape]
        ratios[shape] = {**summarise(per_round), "per_round": per_round,
                         "saving_frac": 1 - statistics.median(per_round),
                         "weights_max_abs_diff": max(w["max_abs_diff"]), "weights_max_abs_change": max(w["max_abs_change"]),
                         "same_batches": all(w["same_batches"])}
        for r in ("on", "off"):
            s = summary[f"{shape}_{r}"]
            rows.append({"config": f"{shape}_{r}", "update_s": s["update_s"]["median"], "min_s": s["update_s"]["min"],
                         "max_s": s["update_s"]["max"], "logprobs_s": s["logprobs_s"], "n": s["update_s"]["n"],
                         "opt_steps": s["optimizer_steps_per_rollout"], "reused_frac": s["old_logprobs_reused_frac"]})
    return summary, ratios, rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds x 2 timed steps")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest size (hidden 32 x 1 layer, 2 prompts x 4, 8 tokens, 1 round of 1 step)")
    ap.add_argument("--rounds", type=int, default=None, help="fits per configuration (default 8; --quick 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per fit (default 3; --quick 2)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (x 4 samples each)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="completion length (the demo's: 128)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default="bench_old_logprob_reuse.json", help="file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps, args.hidden, args.layers, args.prompts, args.max_new_tokens = 1, 1, 32, 1, 2, 8
    args.rounds = args.rounds or (2 if args.quick else 8)
    args.steps = args.steps or (2 if args.quick else 3)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    rates = {"before": machine_rates(args.smoke)}
    with saved_tiny_model(tok, args.hidden, args.layers) as (model_dir, n_params):
        fits, weights = run_fits(args, model_dir, tok, args.prompts, args.max_new_tokens)
    rates["after"] = machine_rates(args.smoke)
    summary, ratios, rows = summarise_fits(fits, weights)
    sizes = {"prompts": args.prompts, "group": GROUP, "batch": args.prompts * GROUP, "max_new_tokens": args.max_new_tokens,
             "hidden": args.hidden, "layers": args.layers, "params": n_params, "eta": ETA, "lr": LR,
             "rounds": args.rounds, "timed_steps_per_fit": args.steps, "shapes": SHAPES}
    print(f"tiny Qwen2 hidden {args.hidden} x {args.layers} layers ({n_params:,} params), {args.prompts} prompts x "
          f"{GROUP}, {args.max_new_tokens} tokens, beta 0, lr {LR}, eta {ETA}; {args.rounds} rounds x {args.steps} steps")
    print(format_table(rows, ["config", "update_s", "min_s", "max_s", "logprobs_s", "n", "opt_steps", "reused_frac"]))
    print(format_table([{"shape": s, "ratio_on_off": r["median"], "min": r["min"], "max": r["max"], "n": r["n"],
                         "saving": r["saving_frac"], "w_max_diff": r["weights_max_abs_diff"],
                         "w_max_change": r["weights_max_abs_change"], "same_batches": r["same_batches"]}
                        for s, r in ratios.items()],
                       ["shape", "ratio_on_off", "min", "max", "n", "saving", "w_max_diff", "w_max_change", "same_batches"]))
    for k, v in rates.items():
        print(f"rates {k}: GEMM fp32 1024^3 {v['gemm_fp32_gflops']:.1f} GFLOP/s, read {v['read_gb_s']:.1f} GB/s")
    path = write_json(args.out, {"summary": summary, "ratios": ratios, "rates": rates, "sizes": sizes,
                                 "smoke": args.smoke})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
