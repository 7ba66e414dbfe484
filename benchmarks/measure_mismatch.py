"""Rollout/trainer mismatch of a real model: the ``mismatch/*`` metrics per probability bucket.

One rollout of ``--prompts`` K&K prompts (generated 3-people puzzles, the ``qwen-instruct``
template, as ``data=kk_generated``) × ``--n`` samples of up to ``--tokens`` tokens at
temperature ``--temperature`` (the project default 0.7, top-p 1, top-k off) from an engine
built from the policy; the policy's logπ_old of the same tokens recomputed as the learner does
(:func:`arlopti.learner.policy.fill_logprobs`, fp32, the CPU trainer's ``precision: 32-true``);
then :func:`arlopti.plugins.mismatch.mismatch_metrics`, printed as a table: all tokens, then
each bucket of p = exp(logπ_old).

``--engine vllm --engine-dtype float32|bfloat16``: a colocated vLLM engine
(:class:`arlopti.rollout.vllm.VLLMEngine`, ``rollout.dtype``); ``--engine hf``: the HF engine on the
live policy (fp32). ``--trainer-precision bf16-mixed`` (issue 49): logπ_old as a bf16-mixed trainer computes it
(Lightning's bf16 autocast, the masters spread within their bf16 rounding intervals as the learner's set-up
does), and the HF engine as the trainer would build it (``rollout.factory.autocast_of``: fp32 packed weights
outside autocast on a CPU), or under bf16 autocast with ``--hf-autocast bf16`` (the engine before issue 49).

Usage (SmolLM2-135M-Instruct, offline; about 2-4 min each on 2 cores)::

    python benchmarks/measure_mismatch.py --engine vllm --engine-dtype float32
    python benchmarks/measure_mismatch.py --engine vllm --engine-dtype bfloat16
    python benchmarks/measure_mismatch.py --engine hf --trainer-precision bf16-mixed [--hf-autocast bf16]
    python benchmarks/measure_mismatch.py --smoke     # the tiny model on the HF engine, 2 x 4 tokens: measures nothing

Output: the table on stdout and ``benchmarks/out/measure_mismatch_<engine>_<dtype>.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import torch

from _common import format_table, machine_info, write_json


def kk_prompts(tok, count: int, seed: int) -> list[list[int]]:
    from arlopti.tasks.kk.generator import sample_puzzles
    from arlopti.tasks.kk.prompts import build_prompt

    puzzles = sample_puzzles(3, count, seed=seed)
    texts = [build_prompt(p, "qwen-instruct", tok).rendered for p in puzzles]
    return tok(texts, add_special_tokens=False)["input_ids"]


def trainer_context(precision: str):
    """Lightning's forward context of a trainer at ``precision``, as the learner's no-grad passes run in it."""
    import contextlib

    if precision == "32-true":
        return contextlib.nullcontext()
    from lightning.pytorch.plugins.precision import MixedPrecision

    return MixedPrecision(precision, "cpu").forward_context()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--engine-dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--trainer-precision", choices=("32-true", "bf16-mixed"), default="32-true")
    ap.add_argument("--hf-autocast", choices=("auto", "bf16"), default="auto",
                    help="--engine hf: the trainer's choice (rollout.factory.autocast_of), or bf16 autocast")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, HF engine, 1 prompt x 2 x 4 tokens")
    ap.add_argument("--out", default=None, help="file name under benchmarks/out/ (or a path); "
                                                "default measure_mismatch_<engine>_<dtype>[_<trainer>].json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.engine, args.engine_dtype, args.prompts, args.n, args.tokens = "tiny", "hf", "float32", 1, 2, 4
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from arlopti.plugins.mismatch import METRIC_NAMES, mismatch_metrics
    from arlopti.plugins.buckets import BUCKET_LABELS, BUCKET_NAMES
    from arlopti.config import RolloutConfig
    from arlopti.learner.experience import build_experience
    from arlopti.learner.policy import PolicyLM, fill_logprobs
    from arlopti.models.loading import load_causal_lm, load_tokenizer
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.factory import autocast_of
    from arlopti.tasks.base import RewardResult
    from arlopti.utils.precision import mixed_compute_dtype, spread_master_weights

    tok = load_tokenizer(args.model)
    policy = PolicyLM(load_causal_lm(args.model, tok, dtype="float32"))
    policy.eval()
    spread_master_weights(policy, mixed_compute_dtype(args.trainer_precision))  # as the learner's set-up
    prompts = kk_prompts(tok, args.prompts, args.seed)
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.tokens, seed=args.seed,
                              logprobs=True)
    t0 = time.perf_counter()
    if args.engine == "vllm":
        from arlopti.rollout.vllm import VLLMEngine

        cfg = RolloutConfig(backend="vllm", dtype=args.engine_dtype, max_new_tokens=args.tokens,
                            max_model_len=1024, return_logprobs=True, seed=args.seed)
        engine = VLLMEngine.from_policy(policy, tok, cfg)
        try:
            comps = engine.generate(prompts, args.n, sampling)
        finally:
            engine.close()
    else:
        if args.engine_dtype != "float32":
            raise SystemExit("--engine hf runs on the live fp32 policy: use --engine-dtype float32")
        from arlopti.rollout.hf import HFEngine

        autocast = torch.bfloat16 if args.hf_autocast == "bf16" else autocast_of(args.trainer_precision, "cpu")
        comps = HFEngine(policy, tok, autocast_dtype=autocast).generate(prompts, args.n, sampling)
    t_gen = time.perf_counter() - t0
    results = [RewardResult(0.0, False, {}) for cs in comps for _ in cs]
    exp = build_experience(prompts, comps, results, pad_id=tok.pad_token_id)
    if exp.engine_logprobs is None:
        raise SystemExit(f"the {args.engine} engine returned no log-probs")
    old = torch.zeros_like(exp.response_mask)
    with trainer_context(args.trainer_precision):
        fill_logprobs(policy, exp, list(range(len(exp))), old, chunk_rows=8, temperature=args.temperature)
    old = old * exp.response_mask
    m = mismatch_metrics(old, exp.engine_logprobs, exp.response_mask)

    rows = []
    sets = [("all", "")] + [(f"{lab} {name}", f"/{name}") for lab, name in zip(BUCKET_LABELS, BUCKET_NAMES)]
    for label, suffix in sets:
        row = {"tokens (p = exp(logp_old))": label}
        for k in METRIC_NAMES:
            v = m[f"mismatch/{k}{suffix}"]
            row[k] = int(v) if k == "tokens" else ("-" if math.isnan(v) else f"{v:.3g}")
        rows.append(row)
    print(f"\n{args.model}: engine {args.engine} {args.engine_dtype}"
          f"{' under bf16 autocast' if args.engine == 'hf' and args.hf_autocast == 'bf16' else ''}, "
          f"trainer {args.trainer_precision}; {len(exp)} responses "
          f"({args.prompts} K&K prompts x {args.n}), T={args.temperature}, generation {t_gen:.0f} s")
    print(format_table(rows, ["tokens (p = exp(logp_old))", *METRIC_NAMES]))
    trainer = "" if args.trainer_precision == "32-true" else f"_{args.trainer_precision}_{args.hf_autocast}"
    path = write_json(args.out or f"measure_mismatch_{args.engine}_{args.engine_dtype}{trainer}.json",
                      {"args": vars(args),
                       "metrics": {k: (None if math.isnan(v) else v) for k, v in m.items()},
                       "generate_s": t_gen, "machine": machine_info()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
