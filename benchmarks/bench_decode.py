"""Decoding near this machine's limit: the HF engine's decoding step against its roofline, and vLLM-CPU.

    python benchmarks/bench_decode.py                      # SmolLM2-135M fp32, batches 8,16,32,64, vLLM fp32 + bf16
    python benchmarks/bench_decode.py --vllm none --profile
    python benchmarks/bench_decode.py --tiny               # the CI size (a tiny random model; measures nothing)

One run measures, in this order:

1. **The machine**: CPU, its flags (AVX2, AVX-512, AVX512-BF16, AMX-BF16), cores, torch's kernels
   and threads (``_common.machine_info``).
2. **Its limits, with torch's threads**: the read bandwidth ``BW`` (bytes / best time of ``x.sum()``
   over a ``--bw-mib`` fp32 tensor, far larger than the last-level cache) and the GEMM rate of
   fp32 and bf16 (best of ``--gemm-reps`` ``n × n`` products, ``--gemm``; ``_common``).
3. **Decoding steps** of the model (``--model``, fp32: the engine's precision on this CPU) at each
   batch ``B`` (``--batches``): ``B`` chat prompts of different lengths (left padding), ``--steps``
   new tokens at T = 0.7 with the engine's sampler and log-probs, EOS banned so every row
   decodes every step. A step is one iteration of ``arlopti.rollout.hf.decode``'s loop (the
   sampler, the bookkeeping and the forward of one token), timed from one forward call to the
   next. Decoders (``--decoders``): ``before`` (the engine before issue 36: the loop over the
   model's forward and ``DynamicCache``, the noise hashed for every entry), ``forward`` (the same
   loop with today's sampler, ``rollout.hf_decoder=forward``), ``loop`` (``arlopti.rollout.kv_decode``
   on oneDNN-packed weights and today's sampler: the engine's default since issue 43), ``loop_unpacked``
   (the same step on the modules' own ``F.linear``, ``rollout.hf_packed=false``: the default before),
   ``loop_bf16`` (``loop`` under bf16 autocast, as under a bf16 trainer; at ``--bf16-batches`` only);
   a suffix ``@n`` runs a decoder with ``n`` torch threads (``loop@1``: the thread count's effect).
   Per round each decoder decodes once, in an order that rotates every round (``--rounds`` ≥ 5);
   ms per step = the median over rounds of each round's median step; ``cpu_per_wall`` = the CPU
   seconds this process used per wall second meanwhile (about torch's thread count when nothing
   else ran: a check that the timing had the machine). **Roofline limit** of a step
   = ``max(W / BW, 2·N·B / GEMM_fp32)``: ``W`` the bytes and ``N`` the count of the weights its
   matmuls read (every parameter but an untied input embedding; a tied one counts once, as the
   LM head). Reported: ms per step, tokens/s (= B / step), the limit, and **limit / step**.
4. **The sampler alone** (``_GumbelSampler.choose``: temperature, hashed Gumbel noise, arg-max,
   log-prob) at ``B × V`` for V = 49,152 (SmolLM2) and 151,936 (Qwen2.5), its share of a step.
5. **vLLM-CPU** (``--vllm``, default ``fp32,bf16``; eager, in-process, the project's
   ``rollout=vllm`` defaults) against our engine: whole ``generate`` calls of ``B`` prompts ×
   ``--vllm-tokens`` tokens (vLLM ``min_tokens``, ours ``HFEngine(min_new_tokens=...)``), tok/s =
   tokens / wall time, ours (fp32, ``loop``) and vLLM alternating for ``--rounds`` rounds, in one
   fresh process per vLLM dtype (one vLLM engine per process). Ratio = ours / vLLM.
6. ``--profile``: ``torch.profiler`` of ``--profile-steps`` decoding steps of each decoder at each
   batch: ops per step and per layer, self CPU time of the top ops (tables in the JSON).

Output: tables on stdout and ``benchmarks/out/bench_decode.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings

import torch

from _common import (CHAT_PROMPTS as PROMPTS, format_table, gemm_rate, interleaved_order, machine_info, read_bandwidth,
                     run_isolated, write_json)

MODEL = "smollm2-135m-instruct"
TEMPERATURE = 0.7
VOCABS = (49152, 151936)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL, help="smollm2-135m-instruct, or tiny (a random test model)")
    ap.add_argument("--batches", default="8,16,32,64")
    ap.add_argument("--steps", type=int, default=32, help="new tokens per decode (steps timed: steps - 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decoders", default="before,forward,loop_unpacked,loop,loop@1,loop_bf16")
    ap.add_argument("--bf16-batches", default="8", help="batches at which loop_bf16 runs (slow without native bf16)")
    ap.add_argument("--vllm", default=None, help="vLLM dtypes to compare against, or none (default fp32,bf16; "
                                                 "none with --tiny)")
    ap.add_argument("--vllm-batches", default="8,32")
    ap.add_argument("--vllm-tokens", type=int, default=32)
    ap.add_argument("--bw-mib", type=int, default=1024)
    ap.add_argument("--gemm", type=int, default=1024)
    ap.add_argument("--gemm-reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--tiny", action="store_true",
                    help="the CI size: tiny model, batch 2, 4 steps, 1 round, no vLLM, small limits")
    ap.add_argument("--out", default="bench_decode.json", help="file name under benchmarks/out/")
    a = ap.parse_args(argv)
    if a.tiny:
        a.model, a.batches, a.steps, a.rounds, a.bf16_batches, a.vllm_batches = "tiny", "2", 4, 1, "2", "2"
        a.vllm, a.vllm_tokens = a.vllm or "none", 4
        a.bw_mib, a.gemm, a.gemm_reps, a.profile_steps = 8, 64, 1, 2
    elif a.rounds < 5:
        ap.error("--rounds must be >= 5 (medians of at least five alternating rounds)")
    a.batches = [int(b) for b in a.batches.split(",")]
    a.bf16_batches = [int(b) for b in a.bf16_batches.split(",") if b]
    a.vllm_batches = [int(b) for b in a.vllm_batches.split(",") if b]
    a.decoders = [d for d in a.decoders.split(",") if d]
    a.vllm = [] if a.vllm == "none" else (a.vllm or "fp32,bf16").split(",")
    if a.steps < 2 or max(a.batches) > 256:
        ap.error("--steps must be >= 2 (one timed step) and every batch <= 256")
    return a


# ------------------------------------------------------------------------------------ the model

def load(model_name: str):
    """(fp32 model in eval mode, tokenizer): SmolLM2 offline, or the tiny random Qwen2 (laid out as
    ``model=tiny_vllm``: head_dim 32, which vLLM-CPU runs)."""
    from arlopti.models.loading import TinySpec, load_causal_lm, load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(model_name)
    spec = TinySpec(num_heads=2, num_kv_heads=1) if model_name.startswith("tiny") else None
    return load_causal_lm(model_name, tok, dtype="float32", tiny=spec).eval(), tok


def prompt_ids(tok, batch: int) -> list[list[int]]:
    """``batch`` chat-formatted prompts of different lengths (the text list cycled, numbered)."""
    texts = [f"{PROMPTS[r % len(PROMPTS)]} ({r})" for r in range(batch)]
    if getattr(tok, "chat_template", None):
        out = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
               for t in texts]
        return [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in out]
    return [tok(t)["input_ids"] for t in texts]


def weights_of(model) -> tuple[int, int]:
    """(count, bytes) of the weights a decoding step's matmuls read: every parameter but an untied
    input embedding (a tied one is the LM head's matrix, counted once by ``parameters()``)."""
    params = list(model.parameters())
    emb = model.get_input_embeddings().weight
    if not model.config.tie_word_embeddings:
        params = [p for p in params if p is not emb]
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = torch.tensor(p), 1
    return ids, mask


class CpuShare:
    """CPU seconds this process used per wall second inside the ``with`` block: about torch's
    thread count when it had the cores to itself, less when another job took some."""

    def __enter__(self):
        self.t0, self.c0 = time.perf_counter(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc):
        self.value = (sum(os.times()[:2]) - self.c0) / (time.perf_counter() - self.t0)


@contextlib.contextmanager
def dense_noise():
    """The sampler as before issue 36: the noise of every vocabulary entry, then the arg-max
    (``arlopti.rollout.hf.gumbel_argmax``'s dense path; the same tokens)."""
    import arlopti.rollout.hf as hf

    sparse = hf.gumbel_argmax
    hf.gumbel_argmax = lambda z, keys, offsets: (hf.gumbel_noise(keys, offsets) + z).argmax(-1)
    try:
        yield
    finally:
        hf.gumbel_argmax = sparse


@contextlib.contextmanager
def torch_threads(threads: str):
    """torch's intra-op thread count set to ``int(threads)`` inside the block ('' leaves it)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TimedStepper:
    """Wraps a decoding stepper; records the time of every ``step`` call (so the differences are
    whole loop iterations: sampler, bookkeeping and forward)."""

    def __init__(self, inner, after_prefill=None):
        self.inner, self.stamps, self.after_prefill = inner, [], after_prefill

    def prefill(self, *a):
        out = self.inner.prefill(*a)
        if self.after_prefill is not None:
            self.after_prefill()
        self.stamps.append(time.perf_counter())
        return out

    def step(self, *a):
        out = self.last = self.inner.step(*a)
        self.stamps.append(time.perf_counter())
        return out


@torch.no_grad()
def decode_once(model, tok, prompts, decoder: str, steps: int, seed: int = 0, keep_logits: bool = False,
                after_prefill=None):
    """Seconds of each decoding step (``steps - 1`` of them) of one decode of ``prompts``; with
    ``keep_logits``, the last step's logits ``[B, V]`` instead. ``after_prefill()`` runs once the
    prefill is done (the profiler's start)."""
    import arlopti.rollout.hf as hf
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.seeds import sample_seed

    ids, mask = left_padded(prompts, tok.pad_token_id)
    sampling = SamplingConfig(temperature=TEMPERATURE, max_new_tokens=steps, logprobs=True)
    sampler = hf._GumbelSampler([sample_seed(seed, r, 0) for r in range(len(prompts))], sampling, "cpu")
    name, _, threads = decoder.partition("@")
    kind = {"before": "forward", "loop_unpacked": "loop"}.get(name, name.removesuffix("_bf16"))
    packed = None
    if name == "loop":  # the engine's default: the projections on oneDNN-packed weights
        from arlopti.rollout.kv_decode import projection_groups
        from arlopti.rollout.packed_linear import PackedLinears

        packed = PackedLinears()
        packed.refresh(projection_groups(model), len(prompts))
    stepper = TimedStepper(hf.stepper_for(model, ids.shape[1] + steps, kind, packed), after_prefill)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=name.endswith("_bf16"))
    with amp, (dense_noise() if name == "before" else contextlib.nullcontext()), torch_threads(threads):
        new = hf.decode(model, ids, mask, sampler, steps, [tok.eos_token_id], tok.pad_token_id,
                        min_new_tokens=steps, stepper=stepper)
    assert new.shape == (len(prompts), steps), new.shape
    if keep_logits:
        return stepper.last[:, -1, :].float()
    return [b - a for a, b in zip(stepper.stamps, stepper.stamps[1:])]


def decode_steps(model, tok, args) -> list[dict]:
    """Section 3: per batch, each decoder's ms per step (median of round medians)."""
    rows = []
    for batch in args.batches:
        prompts = prompt_ids(tok, batch)
        decoders = [d for d in args.decoders if "_bf16" not in d or batch in args.bf16_batches]
        for d in decoders:  # warm-up
            decode_once(model, tok, prompts, d, min(args.steps, 4))
        per_round: dict[str, list[float]] = {d: [] for d in decoders}
        with CpuShare() as share:
            for d in interleaved_order(decoders, args.rounds):
                per_round[d].append(statistics.median(decode_once(model, tok, prompts, d, args.steps)))
        for d in decoders:
            step = statistics.median(per_round[d])
            rows.append({"batch": batch, "decoder": d, "ms_per_step": 1e3 * step, "tok_per_s": batch / step,
                         "n": len(per_round[d]), "round_ms": [1e3 * x for x in per_round[d]],
                         "prompt_width": max(map(len, prompts)), "cpu_per_wall": share.value})
            print(f"  B={batch:3d} {d:10s} {1e3 * step:8.2f} ms/step  {batch / step:7.1f} tok/s  "
                  f"(this process had {share.value:.2f} CPUs)", flush=True)
    return rows


def add_roofline(rows: list[dict], limits: dict, n_w: int, w_bytes: int) -> None:
    """Each row's limit ``max(W / BW, 2·N·B / GEMM_fp32)`` and its share of the measured step."""
    for r in rows:
        bw, gemm = w_bytes / limits["read_bytes_per_s"], 2 * n_w * r["batch"] / limits["gemm_flops"]["fp32"]
        r.update(limit_ms=1e3 * max(bw, gemm), bound="bandwidth" if bw > gemm else "gemm",
                 of_limit=1e3 * max(bw, gemm) / r["ms_per_step"])


def measure_limits(args) -> dict:
    """Section 2: read bandwidth and GEMM rates with torch's threads."""
    return {"read_bytes_per_s": read_bandwidth(args.bw_mib, args.gemm_reps),
            "gemm_flops": {"fp32": gemm_rate(args.gemm, torch.float32, args.gemm_reps),
                           "bf16": gemm_rate(args.gemm, torch.bfloat16, args.gemm_reps)}}


def best_of(a: dict, b: dict) -> dict:
    """The larger of two measurements of each limit (the machine's limit is its best showing)."""
    return {k: best_of(v, b[k]) if isinstance(v, dict) else max(v, b[k]) for k, v in a.items()}


def sampler_cost(model, tok, args, steps_rows: list[dict]) -> list[dict]:
    """Section 4: ms of one ``_GumbelSampler.choose`` (T = 0.7, log-probs) at B × V on the model's
    own logits (the last step of an 8-token decode; tiled for V = 151,936), today's sparse noise
    arg-max against the dense one of before issue 36, alternating, median of ``--rounds``."""
    import arlopti.rollout.hf as hf
    from arlopti.rollout.engine import SamplingConfig

    sampling = SamplingConfig(temperature=TEMPERATURE, logprobs=True)
    step_ms = {r["batch"]: r["ms_per_step"] for r in steps_rows if r["decoder"] == "loop"}
    rows = []
    for batch in args.batches:
        last = decode_once(model, tok, prompt_ids(tok, batch), "loop", 8, keep_logits=True)
        for vocab in VOCABS:
            logits = last.repeat(1, -(-vocab // last.shape[1]))[:, :vocab].contiguous()
            z = hf.filter_logits(logits, TEMPERATURE, -1, 1.0)
            candidates = int((z >= z.max(-1, keepdim=True).values - hf._GUMBEL_SPAN).sum())
            times: dict[str, list[float]] = {"sparse": [], "dense": []}
            for name in interleaved_order(list(times), max(args.rounds, 5) + 1):
                sampler = hf._GumbelSampler(list(range(batch)), sampling, "cpu")
                with dense_noise() if name == "dense" else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    sampler.choose(logits)
                    times[name].append(time.perf_counter() - t0)
            ms = {k: 1e3 * statistics.median(v[1:]) for k, v in times.items()}  # the first call of each: warm-up
            rows.append({"batch": batch, "vocab": vocab, "sampler_ms": ms["sparse"], "dense_ms": ms["dense"],
                         "candidate_share": candidates / z.numel(), "n": len(times["sparse"]) - 1,
                         "of_loop_step": ms["sparse"] / step_ms[batch] if batch in step_ms else None})
    return rows


def profile_steps(model, tok, args) -> dict:
    """Section 6: ``torch.profiler`` of ``--profile-steps`` decoding steps (the prefill excluded) per
    decoder and batch; ``ops_per_step`` counts the ops the step dispatches itself (top level)."""
    from torch.profiler import ProfilerActivity, profile

    layers = model.config.num_hidden_layers
    out = {}
    for batch in args.batches:
        prompts = prompt_ids(tok, batch)
        for d in [d for d in args.decoders if d in ("before", "loop_unpacked", "loop")]:
            prof = profile(activities=[ProfilerActivity.CPU])
            decode_once(model, tok, prompts, d, args.profile_steps + 1, after_prefill=prof.start)
            prof.stop()
            events = prof.key_averages()
            top = sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))
            self_ms = sum(e.self_cpu_time_total for e in events) / 1e3
            key = f"B={batch} {d}"
            out[key] = {"ops_per_step": top / args.profile_steps, "ops_per_layer": top / args.profile_steps / layers,
                        "self_cpu_ms_per_step": self_ms / args.profile_steps,
                        "table": events.table(sort_by="self_cpu_time_total", row_limit=18)}
            print(f"--- profile {key}: {out[key]['ops_per_step']:.0f} top-level ops per step "
                  f"({out[key]['ops_per_layer']:.1f} per layer), {out[key]['self_cpu_ms_per_step']:.1f} ms self CPU "
                  f"per step ---\n{out[key]['table']}", flush=True)
    return out


# ------------------------------------------------------------------------------- vLLM, in a child

def vllm_against_ours(model: str, dtype: str, batches: list[int], tokens: int, rounds: int,
                      threads: int | None = None) -> dict:
    """Section 5, run in a fresh process: ours (fp32, ``loop``) and vLLM (``dtype``) alternating."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if threads:
        torch.set_num_threads(threads)
    from arlopti.config import RolloutConfig
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.hf import HFEngine
    from arlopti.rollout.vllm import VLLMEngine

    hf_model, tok = load(model)
    sampling = SamplingConfig(temperature=TEMPERATURE, max_new_tokens=tokens, seed=1234)
    widest = max(len(p) for p in prompt_ids(tok, max(batches)))
    t0 = time.perf_counter()
    cfg = RolloutConfig(backend="vllm", dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype], max_new_tokens=tokens,
                        max_model_len=widest + tokens + 16)
    engines = {"ours": HFEngine(hf_model, tok, generation_batch_size=max(batches), min_new_tokens=tokens),
               "vllm": VLLMEngine.from_policy(hf_model, tok, cfg)}
    build_s = time.perf_counter() - t0
    engines["vllm"].extra_sampling_kwargs = {"min_tokens": tokens}
    result = {"dtype": dtype, "vllm_build_s": build_s, "torch_threads": torch.get_num_threads(), "batches": {}}
    for batch in batches:
        prompts = prompt_ids(tok, batch)
        tps: dict[str, list[float]] = {k: [] for k in engines}
        for name in engines:  # warm-up
            engines[name].generate(prompts, 1, sampling)
        for name in interleaved_order(list(engines), rounds):
            t0 = time.perf_counter()
            groups = engines[name].generate(prompts, 1, sampling)
            dt = time.perf_counter() - t0
            lengths = {len(c.token_ids) for g in groups for c in g}
            if lengths != {tokens}:
                raise RuntimeError(f"{name}: response lengths {sorted(lengths)} != {tokens}")
            tps[name].append(batch * tokens / dt)
        result["batches"][str(batch)] = {k: {"median_tok_per_s": statistics.median(v), "samples": v}
                                         for k, v in tps.items()}
    engines["vllm"].close()
    return result


def vllm_rows(args) -> list[dict]:
    rows = []
    for dtype in args.vllm:
        res = run_isolated(__file__, "vllm_against_ours", {"model": args.model, "dtype": dtype,
                                                           "batches": args.vllm_batches, "tokens": args.vllm_tokens,
                                                           "rounds": args.rounds, "threads": args.threads})
        for batch, r in res["batches"].items():
            ours, vl = r["ours"]["median_tok_per_s"], r["vllm"]["median_tok_per_s"]
            rows.append({"vllm_dtype": dtype, "batch": int(batch), "ours_fp32_tok_s": ours, "vllm_tok_s": vl,
                         "ours_over_vllm": ours / vl, "n": args.rounds, "vllm_build_s": res["vllm_build_s"],
                         "samples": r})
            print(f"  vLLM {dtype} B={batch}: ours {ours:.1f} tok/s, vLLM {vl:.1f} tok/s, ours/vLLM {ours / vl:.2f}",
                  flush=True)
    return rows


# ---------------------------------------------------------------------------------------- main

def main(argv=None) -> dict:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"{machine['cpu']}: flags {machine['cpu_flags']}, {machine['cores']} CPUs, torch {machine['torch']} "
          f"({machine['torch_kernels']} kernels, {machine['torch_threads']} threads)", flush=True)
    before = measure_limits(args)
    model, tok = load(args.model)
    n_w, w_bytes = weights_of(model)
    print(f"{args.model}: {n_w:,} weights in matmuls, {w_bytes / 1e6:.0f} MB; {args.steps} new tokens, T={TEMPERATURE}",
          flush=True)
    steps = decode_steps(model, tok, args)
    limits = best_of(before, measure_limits(args))
    print(f"limits (best of before and after the decoding): read bandwidth {limits['read_bytes_per_s'] / 1e9:.1f} "
          f"GB/s ({args.bw_mib} MiB sum); GEMM {args.gemm}^3: fp32 {limits['gemm_flops']['fp32'] / 1e9:.1f}, "
          f"bf16 {limits['gemm_flops']['bf16'] / 1e9:.1f} GFLOP/s", flush=True)
    add_roofline(steps, limits, n_w, w_bytes)
    sampler = sampler_cost(model, tok, args, steps)
    profiles = profile_steps(model, tok, args) if args.profile else {}
    del model
    vllm = vllm_rows(args)
    print(format_table(steps, ["batch", "decoder", "ms_per_step", "tok_per_s", "limit_ms", "bound", "of_limit", "n",
                               "cpu_per_wall"]))
    print(format_table(sampler, ["batch", "vocab", "sampler_ms", "dense_ms", "candidate_share", "of_loop_step", "n"]))
    if vllm:
        print(format_table(vllm, ["vllm_dtype", "batch", "ours_fp32_tok_s", "vllm_tok_s", "ours_over_vllm", "n"]))
    result = {"args": vars(args), "model": args.model, "weights": n_w, "weight_bytes": w_bytes,
              "limits": limits, "limits_before": before, "decode_steps": steps, "sampler": sampler,
              "vllm": vllm, "profiles": profiles}
    print(f"wrote {write_json(args.out, result)}")
    return result


if __name__ == "__main__":
    main()
