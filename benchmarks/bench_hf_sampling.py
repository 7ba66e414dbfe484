"""Generation speed of the HF engine: per-row ``torch.Generator`` noise (before) vs hashed noise (after).

Issue 18: ``arlopti.rollout.hf._GumbelSampler`` drew its Gumbel noise with one ``torch.Generator``
per response (one ``torch.rand`` per row per decoding step); it now hashes ``(seed, step, vocab
index)`` in one batched op per step (:func:`arlopti.rollout.hf.gumbel_noise`). ``before`` below is
:class:`PerRowGeneratorSampler`, a restatement of the old processor (the same filtering, arg-max
and log-prob recording; only the noise source differs), swapped into the engine for the run.

Setup: the ``bench_step`` model (random Qwen2, ``--hidden`` × ``--layers``, tiny BPE tokenizer),
``HFEngine.generate`` of ``--prompts`` prompts × ``--n`` samples, exactly ``--tokens`` new tokens
(``min_new_tokens``), temperature 1, fp32 CPU, one ``generate`` batch. ``--rounds`` rounds, each
timing one call of each variant, the order alternating every round (before, after / after,
before); 1 untimed warm-up call each. tok/s = generated tokens / wall seconds of ``generate``;
reported: the median over rounds per variant, and the median of the per-round ratios.

``--profile``: additionally print ``torch.profiler``'s top ops (self CPU time) of one call of each.

``--noise-only``: time just the noise of one decoding step, ``[B, V]`` Gumbel noise by each
variant (before: ``B`` seeded generators, one ``torch.rand(V)`` each, then ``−log(−log u)``;
after: :meth:`arlopti.rollout.hf._GumbelSampler.noise`), for ``B × V`` in 8 × 491 (the tiny
model), 64 × 49,152 (SmolLM2's vocabulary) and 64 × 151,936 (Qwen2.5's); alternating, median of
``--rounds`` (each sample the mean of 5 calls).

Usage: ``python benchmarks/bench_hf_sampling.py`` (about 1 min on 2 cores).
Output: a table on stdout and ``benchmarks/out/bench_hf_sampling.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from _common import format_table, write_json


class PerRowGeneratorSampler:
    """The pre-issue-18 sampler: noise ``−log(−log u)``, ``u`` from one seeded generator per row
    (``torch.rand(V, generator=g_r)`` per row per step, clamped to ``[1e-20, 1 − 1e-7]``)."""

    def __init__(self, seeds, sampling, device):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.logprobs = []

    def __call__(self, input_ids, scores):
        from arlopti.rollout.hf import filter_logits

        s = self.sampling
        z = scores.float() if self.greedy else filter_logits(scores, s.temperature, s.top_k, s.top_p)
        if self.greedy:
            noisy = z
        else:
            u = torch.stack([torch.rand(z.shape[-1], generator=g, device=z.device) for g in self.gens])
            noisy = z - torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        choice = noisy.argmax(-1)
        if s.logprobs:
            self.logprobs.append(torch.log_softmax(z, -1).gather(-1, choice[:, None]).squeeze(-1))
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, choice[:, None], 0.0)
        return out


def _engine(hidden: int, layers: int, tokens: int):
    from arlopti.models import TinySpec, build_tiny_model, build_tiny_tokenizer
    from arlopti.rollout.hf import HFEngine

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinySpec(arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=4,
                                           num_kv_heads=2, intermediate_size=2 * hidden, tie_word_embeddings=True))
    model.generation_config.min_new_tokens = tokens
    return HFEngine(model, tok, generation_batch_size=1024), tok


NOISE_SHAPES = ((8, 491), (64, 49152), (64, 151936))


def noise_only(rounds: int) -> dict:
    """Median seconds per decoding step's noise, before vs after, for each ``NOISE_SHAPES`` entry."""
    import arlopti.rollout.hf as hf
    from arlopti.rollout.engine import SamplingConfig

    out = {}
    for b, v in NOISE_SHAPES:
        seeds = [hf.sample_seed(0, i, 0) for i in range(b)]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        sampler = hf._GumbelSampler(seeds, SamplingConfig(temperature=1.0), "cpu")

        def before():
            u = torch.stack([torch.rand(v, generator=g) for g in gens]).clamp(1e-20, 1.0 - 1e-7)
            return u.log().neg().log().neg()

        fns = {"before": before, "after": lambda: sampler.noise(v)}
        got = {k: [] for k in fns}
        for name in fns:
            fns[name]()
        for r in range(rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = time.perf_counter()
                for _ in range(5):
                    fns[name]()
                got[name].append((time.perf_counter() - t0) / 5)
        med = {k: statistics.median(x) for k, x in got.items()}
        out[f"{b}x{v}"] = {"before_ms": 1e3 * med["before"], "after_ms": 1e3 * med["after"],
                           "after_over_before": med["after"] / med["before"], "n": rounds}
        print(f"  noise {b} x {v}: before {1e3 * med['before']:.3f} ms, after {1e3 * med['after']:.3f} ms, "
              f"after/before {med['after'] / med['before']:.3f}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--noise-only", action="store_true", help="time only one step's noise at 3 sizes")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    if args.noise_only:
        res = noise_only(args.rounds)
        print(f"wrote {write_json('bench_hf_sampling_noise.json', {'noise': res})}")
        return 0
    import arlopti.rollout.hf as hf
    from arlopti.rollout.engine import SamplingConfig

    after_cls = hf._GumbelSampler
    variants = {"before": PerRowGeneratorSampler, "after": after_cls}
    engine, tok = _engine(args.hidden, args.layers, args.tokens)
    prompts = [tok(f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?")["input_ids"]
               for i in range(args.prompts)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.tokens, seed=0)

    def call(name: str) -> tuple[float, int]:
        hf._GumbelSampler = variants[name]
        try:
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.n, sampling)
            dt = time.perf_counter() - t0
        finally:
            hf._GumbelSampler = after_cls
        return dt, sum(len(c.token_ids) for cs in out for c in cs)

    for name in variants:  # warm-up
        call(name)
    tps = {k: [] for k in variants}
    ratios = []
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        got = {}
        for name in order:
            dt, ntok = call(name)
            assert ntok == args.prompts * args.n * args.tokens, ntok
            got[name] = ntok / dt
            tps[name].append(got[name])
        ratios.append(got["after"] / got["before"])
        print(f"  round {r + 1}: before {got['before']:.0f} tok/s, after {got['after']:.0f} tok/s", flush=True)
    rows = [{"variant": k, "median_tok_s": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in tps.items()]
    print(format_table(rows, ["variant", "median_tok_s", "min", "max", "n"]))
    summary = {"after_over_before_medians": statistics.median(tps["after"]) / statistics.median(tps["before"]),
               "after_over_before_paired_median": statistics.median(ratios)}
    for k, v in summary.items():
        print(f"{k}: {v:.3f}")
    prof = {}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in variants:
            with profile(activities=[ProfilerActivity.CPU]) as p:
                call(name)
            table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            prof[name] = table
            print(f"--- profile of one generate call, {name} ---\n{table}")
    path = write_json("bench_hf_sampling.json", {"args": vars(args), "tok_s": tps, "paired_ratios": ratios,
                                                 "summary": summary, "profile": prof})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
