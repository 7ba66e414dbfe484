"""Cost of ``rollout.return_logprobs=true`` on the HF engine: ``generate`` with and without log-probs.

With log-probs on, :class:`arlopti.rollout.hf._GumbelSampler` adds one ``log_softmax`` over the
``[B, V]`` processed logits and a gather per decoding step; everything else is the same call.
This times ``HFEngine.generate`` of ``--prompts`` prompts × ``--n`` samples of exactly
``--tokens`` new tokens (``min_new_tokens``), temperature 0.7, fp32 CPU, one ``generate`` batch,
``--rounds`` rounds alternating the order (off, on / on, off) after one untimed warm-up call each.
Reported: median tok/s per variant and the median of the per-round ratios on/off.

``--model tiny``: the ``bench_step`` model (random Qwen2, hidden 256 × 4 layers, the 512-token test
tokenizer), where the log_softmax is over 512 entries; ``--model smollm2-135m-instruct``: the real
135M model with its 49,152-entry vocabulary (offline, see configs/model/smollm2-135m-instruct.yaml).

Usage: ``python benchmarks/bench_hf_logprobs.py --model tiny`` (about 20 s on 2 cores) and
``--model smollm2-135m-instruct`` (about 2 min). Output: a table on stdout and
``benchmarks/out/bench_hf_logprobs_<model>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from _common import format_table, hf_engine_for, machine_info, write_json


def _engine(model_name: str, tokens: int):
    engine, tok = hf_engine_for(model_name, tokens)
    return engine, tok, engine.hf.config.vocab_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from arlopti.rollout.engine import SamplingConfig

    engine, tok, vocab = _engine(args.model, args.tokens)
    prompts = [tok(f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?")["input_ids"]
               for i in range(args.prompts)]

    def call(logprobs: bool) -> float:
        sampling = SamplingConfig(temperature=0.7, max_new_tokens=args.tokens, seed=0, logprobs=logprobs)
        t0 = time.perf_counter()
        out = engine.generate(prompts, args.n, sampling)
        dt = time.perf_counter() - t0
        ntok = sum(len(c.token_ids) for cs in out for c in cs)
        assert ntok == args.prompts * args.n * args.tokens, ntok
        assert all((c.logprobs is not None) == logprobs for cs in out for c in cs)
        return ntok / dt

    variants = {"off": False, "on": True}
    for v in variants.values():  # warm-up
        call(v)
    tps = {k: [] for k in variants}
    ratios = []
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        got = {name: call(variants[name]) for name in order}
        for name, v in got.items():
            tps[name].append(v)
        ratios.append(got["on"] / got["off"])
        print(f"  round {r + 1}: off {got['off']:.1f} tok/s, on {got['on']:.1f} tok/s", flush=True)
    rows = [{"logprobs": k, "median_tok_s": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in tps.items()]
    print(f"model {args.model} (vocab {vocab}), {args.prompts} prompts x {args.n} samples x "
          f"{args.tokens} tokens")
    print(format_table(rows, ["logprobs", "median_tok_s", "min", "max", "n"]))
    paired = statistics.median(ratios)
    print(f"on/off throughput, median of paired rounds: {paired:.3f} "
          f"({(1 - paired) * 100:+.1f}% slower with log-probs)")
    path = write_json(f"bench_hf_logprobs_{args.model}.json",
                      {"args": vars(args), "vocab": vocab, "tok_s": tps, "paired_ratios": ratios,
                       "paired_median": paired, "machine": machine_info()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
