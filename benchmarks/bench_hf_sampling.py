"""Generation speed of the HF engine, before and after issue 18's two changes to it.

Issue 18: ``arlopti.rollout.hf._GumbelSampler`` drew its Gumbel noise with one ``torch.Generator``
per response (one ``torch.rand`` per row per decoding step); it now hashes ``(seed, step, vocab
index)`` in one batched op per step (:func:`arlopti.rollout.hf.gumbel_noise`). And the engine
decoded with transformers' ``generate``; it now runs its own loop over the model's forward
(:func:`arlopti.rollout.hf.decode`, ``rollout.hf_decoder=loop``). Three variants:

* ``before``: :class:`PerRowGeneratorSampler`, a restatement of the old processor (the same
  filtering, arg-max and log-prob recording; only the noise source differs), in ``generate``;
* ``hashed``: today's sampler in ``generate`` (``rollout.hf_decoder=generate``);
* ``after``: today's sampler in our loop (the default engine).

Setup: the ``bench_step`` model (random Qwen2, ``--hidden`` × ``--layers``, tiny BPE tokenizer;
or ``--model smollm2-135m-instruct``, fp32),
``HFEngine.generate`` of ``--prompts`` prompts × ``--n`` samples, exactly ``--tokens`` new tokens
(``min_new_tokens``), temperature 1, fp32 CPU, one ``generate`` batch. ``--rounds`` rounds, each
timing one call of each variant, the order rotated every round; 1 untimed warm-up call each.
tok/s = generated tokens / wall seconds of ``HFEngine.generate``; reported: the median over
rounds per variant, and the medians of the per-round ratios to ``before``.

``--profile``: additionally print ``torch.profiler``'s top ops (self CPU time) of one call of each.

``--noise-only``: time just the noise of one decoding step, ``[B, V]`` Gumbel noise by each
variant (before: ``B`` seeded generators, one ``torch.rand(V)`` each, then ``−log(−log u)``;
after: :meth:`arlopti.rollout.hf._GumbelSampler.noise`), for ``B × V`` in 8 × 491 (the tiny
model), 64 × 49,152 (SmolLM2's vocabulary) and 64 × 151,936 (Qwen2.5's); alternating, median of
``--rounds`` (each sample the mean of 5 calls).

Usage: ``python benchmarks/bench_hf_sampling.py`` (about 1 min on 2 cores);
``python benchmarks/bench_hf_sampling.py --model smollm2-135m-instruct --prompts 2 --n 4 --tokens 64 --rounds 5``.
Output: a table on stdout and ``benchmarks/out/bench_hf_sampling.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from _common import format_table, hf_engine_for, write_json


class PerRowGeneratorSampler:
    """The pre-issue-18 sampler: noise ``−log(−log u)``, ``u`` from one seeded generator per row
    (``torch.rand(V, generator=g_r)`` per row per step, clamped to ``[1e-20, 1 − 1e-7]``)."""

    def __init__(self, seeds, sampling, device):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.logprobs = []

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, self.choose(scores)[:, None], 0.0)
        return out

    def choose(self, scores):
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
        return choice


NOISE_SHAPES = ((8, 491), (64, 49152), (64, 151936))


def noise_only(rounds: int) -> dict:
    """Median seconds per decoding step's noise, before vs after, for each ``NOISE_SHAPES`` entry."""
    import arlopti.rollout.hf as hf
    from arlopti.rollout.seeds import sample_seed
    from arlopti.rollout.engine import SamplingConfig

    out = {}
    for b, v in NOISE_SHAPES:
        seeds = [sample_seed(0, i, 0) for i in range(b)]
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
    ap.add_argument("--model", default="tiny", help="tiny (--hidden/--layers) or smollm2-135m-instruct")
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
    from arlopti.rollout.seeds import sample_seed
    from arlopti.rollout.engine import SamplingConfig

    after_cls = hf._GumbelSampler
    variants = {"before": (PerRowGeneratorSampler, "generate"), "hashed": (after_cls, "generate"),
                "after": (after_cls, "loop")}
    engine, tok = hf_engine_for(args.model, args.tokens, args.hidden, args.layers)
    prompts = [tok(f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?")["input_ids"]
               for i in range(args.prompts)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.tokens, seed=0)

    def call(name: str) -> tuple[float, int]:
        hf._GumbelSampler, engine.decoder = variants[name]
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
    ratios = {k: [] for k in variants if k != "before"}
    names = list(variants)
    for r in range(args.rounds):
        got = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            dt, ntok = call(name)
            assert ntok == args.prompts * args.n * args.tokens, ntok
            got[name] = ntok / dt
            tps[name].append(got[name])
        for k in ratios:
            ratios[k].append(got[k] / got["before"])
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in got.items()), flush=True)
    rows = [{"variant": k, "median_tok_s": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in tps.items()]
    print(format_table(rows, ["variant", "median_tok_s", "min", "max", "n"]))
    summary = {}
    for k in ratios:
        summary[f"{k}_over_before_medians"] = statistics.median(tps[k]) / statistics.median(tps["before"])
        summary[f"{k}_over_before_paired_median"] = statistics.median(ratios[k])
    summary["after_over_hashed_medians"] = statistics.median(tps["after"]) / statistics.median(tps["hashed"])
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
    out_name = "bench_hf_sampling.json" if args.model == "tiny" else f"bench_hf_sampling_{args.model}.json"
    path = write_json(out_name, {"args": vars(args), "tok_s": tps, "paired_ratios": ratios, "summary": summary,
                                 "profile": prof})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
