"""Rollout throughput: the HF engine vs the vLLM engine on SmolLM2-135M-Instruct, same work.

    python benchmarks/bench_rollout.py [--quick] [--repeats 5] [--out bench_rollout.json]

``--quick`` (4 prompts x n=4 x 64 tokens, 5 rounds) takes about 2-3 minutes on 2 CPU cores; the
default (8 prompts x n=8 x 128 tokens) about 10.

Both engines get the same chat-formatted prompts (8, or 4 with ``--quick``), ``n`` samples each
at T = 0.7 with per-sample seeds (the training path), weights in ``--dtype`` (default ``auto``:
bf16 where the CPU has native bf16, AVX512-BF16 or AMX, else fp32, as ``trainer.precision=auto``
picks; :mod:`arlopti.utils.precision`), and generate **exactly** ``max_new_tokens`` tokens per
response: EOS is suppressed on both sides (HF: ``HFEngine(min_new_tokens=...)``; vLLM:
``min_tokens`` on every request), and the script checks every response has that length. The HF
engine is :class:`arlopti.rollout.hf.HFEngine` (one batched call of all P·n rows, its default
decoder, our Gumbel sampler); the vLLM engine is :class:`arlopti.rollout.vllm.VLLMEngine`
(in-process, eager unless ``--compiled``).

Timing: one warm-up call each (not counted), then ``--repeats`` (>= 5) rounds in one process,
alternating which engine goes first (``_common.interleaved_order``: HF vLLM, vLLM HF, ...);
tokens/s = generated tokens / wall time of the call. Reported: the median tokens/s of each
engine and the median of the per-round ratios vLLM / HF, as a table, and as JSON under
``benchmarks/out/`` (``_common.write_json``: with the command line and machine info).
Engine build time (vLLM: saving the model + starting the engine) is reported separately.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


import torch

from _common import CHAT_PROMPTS as PROMPTS, format_table, interleaved_order, machine_info, write_json


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts x n=4 x 64 tokens")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all CPUs)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="weights of both engines (auto: bf16 where the CPU has native bf16, else fp32)")
    ap.add_argument("--compiled", action="store_true", help="vLLM with torch.compile (slow start) instead of eager")
    ap.add_argument("--out", default="bench_rollout.json", help="file name under benchmarks/out/")
    a = ap.parse_args(argv)
    if a.quick:
        a.prompts, a.n, a.max_new_tokens = 4, 4, 64
    if a.repeats < 5:
        ap.error("--repeats must be >= 5 (the median of at least five rounds is reported)")
    if not 1 <= a.prompts <= len(PROMPTS):
        ap.error(f"--prompts must lie in [1, {len(PROMPTS)}]")
    return a


def timed(engine, prompts, n, sampling, length):
    t0 = time.perf_counter()
    groups = engine.generate(prompts, n, sampling)
    dt = time.perf_counter() - t0
    lengths = {len(c.token_ids) for g in groups for c in g}
    if lengths != {length}:
        raise RuntimeError(f"{type(engine).__name__}: response lengths {sorted(lengths)} != {length}")
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return tokens, dt


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlopti.config import RolloutConfig
    from arlopti.models.loading import smollm2_local_path
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.hf import HFEngine
    from arlopti.rollout.vllm import VLLMEngine
    from arlopti.utils.precision import native_bf16

    native, why = native_bf16("cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if native else "float32")
    print(f"dtype {dtype}" + (f" (auto: {why})" if args.dtype == "auto" else ""), flush=True)
    path = smollm2_local_path()  # the bf16 conversion, loaded in `dtype` (as training loads it)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p in PROMPTS[:args.prompts]]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    L = args.max_new_tokens
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=L, seed=1234)

    hf = HFEngine(model, tok, generation_batch_size=len(prompts) * args.n, min_new_tokens=L)
    t0 = time.perf_counter()
    cfg = RolloutConfig(backend="vllm", dtype=dtype, max_new_tokens=L, enforce_eager=not args.compiled,
                        max_model_len=max(len(p) for p in prompts) + L + 16)
    vl = VLLMEngine.from_policy(model, tok, cfg)
    build_s = time.perf_counter() - t0
    vl.extra_sampling_kwargs = {"min_tokens": L}
    threads_after = torch.get_num_threads()

    timed(hf, prompts, args.n, sampling, L)  # warm-up
    timed(vl, prompts, args.n, sampling, L)
    rounds = [{} for _ in range(args.repeats)]
    engines = {"hf": hf, "vllm": vl}
    order = list(interleaved_order(list(engines), args.repeats))
    for k, name in enumerate(order):
        r = k // len(engines)
        tokens, dt = timed(engines[name], prompts, args.n, sampling, L)
        rounds[r][name] = {"tokens": tokens, "seconds": dt, "tok_per_s": tokens / dt}
        rounds[r].setdefault("order", []).append(name)
        if len(rounds[r]) == 3:
            row = rounds[r]
            row["ratio"] = row["vllm"]["tok_per_s"] / row["hf"]["tok_per_s"]
            print(f"round {r + 1} ({' then '.join(row['order'])}): HF {row['hf']['tok_per_s']:8.1f} tok/s   "
                  f"vLLM {row['vllm']['tok_per_s']:8.1f} tok/s   ratio {row['ratio']:.2f}", flush=True)
    vl.close()

    med = {k: statistics.median(r[k]["tok_per_s"] for r in rounds) for k in engines}
    spread = {k: (min(r[k]["tok_per_s"] for r in rounds), max(r[k]["tok_per_s"] for r in rounds)) for k in engines}
    ratio = statistics.median(r["ratio"] for r in rounds)
    faster = "vllm" if ratio > 1 else "hf"
    result = {
        "model": "SmolLM2-135M-Instruct", "dtype": dtype, "hf_decoder": hf.decoder, "prompts": len(prompts), "n": args.n,
        "max_new_tokens": L, "tokens_per_call": len(prompts) * args.n * L, "temperature": 0.7,
        "vllm_mode": "compiled" if args.compiled else "eager", "repeats": args.repeats,
        "torch_threads_after_vllm_init": threads_after, "vllm_build_s": build_s,
        "median_tok_per_s": med, "median_ratio_vllm_over_hf": ratio, "faster": faster, "rounds": rounds,
    }
    print()
    print(f"{len(prompts)} prompts x n={args.n} x {L} tokens = {len(prompts) * args.n * L} tokens per call, "
          f"T=0.7, {dtype}; median of {args.repeats} alternating rounds")
    rows = [{"engine": f"HF (HFEngine, decoder={hf.decoder})", "median tok/s": med["hf"], "min": spread["hf"][0],
             "max": spread["hf"][1]},
            {"engine": f"vLLM ({result['vllm_mode']})", "median tok/s": med["vllm"], "min": spread["vllm"][0],
             "max": spread["vllm"][1]}]
    print(format_table(rows, ["engine", "median tok/s", "min", "max"]))
    print(f"ratio vLLM / HF (median of per-round ratios): {ratio:.2f}  -> faster here: {faster}")
    m = machine_info()
    print(f"vLLM engine build (save + start): {build_s:.1f} s; {m['cpu']}, {m['cores']} CPUs, torch threads "
          f"{torch.get_num_threads()} (after vLLM start: {threads_after}), load {m['load_avg_1_5_15']}")
    print(f"wrote {write_json(args.out, result)}")
    return result


if __name__ == "__main__":
    main()
