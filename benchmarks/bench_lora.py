"""LoRA (r=16, all-linear) against full-parameter training on SmolLM2-135M-Instruct (CPU, fp32).

    flock /tmp/arlopti-cpu.lock python benchmarks/bench_lora.py [--repeats 5] [--skip-vllm]
    python benchmarks/bench_lora.py --smoke     # the tiny model, one sample each, no vLLM: measures nothing

Learner (one fresh process per sample, the configurations alternating, ``--repeats`` each): the
real ``GRPOModule`` is built (so the full-parameter run loads its frozen reference model and the
LoRA run does not: its reference is the policy with the adapters off), then on the same batch
(``--batch`` responses of ``--tokens`` tokens after a 32-token prompt) it runs one warm-up and one
timed step of: old log-probs + reference log-probs (no grad) and one update (forward, backward,
clip, ``AdamW.step()`` of the trainable parameters). Configurations (``--configs``):

* ``full``: every parameter, activations kept; ``full_ckpt``: the same with ``model.gradient_checkpointing``;
* ``lora_r16``: LoRA with ``model.lora.activation_checkpointing=false`` (activations kept);
* ``lora_r16_auto``: LoRA with the default ``null`` (auto: checkpointed when the micro-batch's
  activations are estimated at >= 256 MiB; ``checkpointed`` says what it did).

Reported: the growth of the process's peak RSS over its start (model, reference, gradients, Adam
moments and activations included), time per update, time per step (log-prob passes + update), and
the ratios to ``full`` (the goal: LoRA's peak <= 0.5x full's) and of auto over ``lora_r16`` (what
checkpointing costs in time).

vLLM (``rollout=vllm`` on CPU; one process per engine kind, alternating plain/adapter twice):
sync time of a full-parameter policy and of a LoRA policy in ``merged`` mode into a plain engine,
and of ``adapter`` mode into a LoRA-enabled engine (medians of ``--repeats`` syncs per process);
decoding tokens/s of the plain engine against the LoRA-serving one (``min_tokens`` forces equal
lengths). Writes ``benchmarks/out/bench_lora.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import format_table, interleaved_order, max_rss_bytes, run_isolated, write_json

MODEL = "smollm2-135m-instruct"
#: name -> (LoRA rank, model.gradient_checkpointing, model.lora.activation_checkpointing)
CONFIGS = {"full": (0, False, None), "full_ckpt": (0, True, None), "lora_r16": (16, False, False),
           "lora_r16_auto": (16, False, None)}


def learner_sample(lora_r: int, batch: int, tokens: int, threads: int = 2, model: str = MODEL,
                   gradient_checkpointing: bool = False, lora_checkpointing: bool | None = None) -> dict:
    """One process: build the learner, then a warm-up and a timed step (see the module docstring)."""
    import torch

    torch.set_num_threads(threads)
    from arlopti.config import AlgorithmConfig, LoraConfig, ModelConfig, OptimConfig, RunConfig
    from arlopti.models.lora import adapters_disabled
    from arlopti.learner.module import GRPOModule
    from arlopti.learner.optim import build_optimizer
    from arlopti.models.loading import load_tokenizer

    tok = load_tokenizer(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tok), (batch, 32 + tokens), generator=g)
    mask = torch.ones_like(ids)
    adv = torch.randn(batch, tokens, generator=g)
    rss0 = max_rss_bytes()
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.001), optim=OptimConfig(),
                    model=ModelConfig(name_or_path=model, gradient_checkpointing=gradient_checkpointing,
                                      lora=LoraConfig(r=lora_r, activation_checkpointing=lora_checkpointing)))
    module = GRPOModule(cfg, tokenizer=tok)
    policy = module.policy
    trainable = [p for p in policy.parameters() if p.requires_grad]
    opt, _ = build_optimizer(trainable, cfg.optim)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        with torch.no_grad():
            policy.eval()
            old, _ = policy(ids, mask, 32, 1.0, with_entropy=False)
            if module.ref is not None:
                module.ref(ids, mask, 32, 1.0, with_entropy=False)
            else:
                with adapters_disabled(policy):
                    policy(ids, mask, 32, 1.0, with_entropy=False)
        t1 = time.perf_counter()
        policy.train()
        opt.zero_grad(set_to_none=True)
        lp, _ = policy(ids, mask, 32, 1.0, with_entropy=True)
        (-(torch.exp(lp - old) * adv).mean()).backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        t2 = time.perf_counter()
        return t2 - t1, t2 - t0

    step()
    update_s, step_s = step()
    auto = getattr(policy.hf, "arlopti_auto_checkpointing", None)
    layers = [m for m in policy.hf.modules() if hasattr(m, "gradient_checkpointing") and hasattr(m, "self_attn")]
    return {"peak_rss_mb": (max_rss_bytes() - rss0) / 2**20, "update_s": update_s, "step_s": step_s,
            "trainable": sum(p.numel() for p in trainable), "has_ref_copy": module.ref is not None,
            "checkpointed": (bool(auto.state) if auto is not None and not auto.pinned
                             else any(m.gradient_checkpointing for m in layers))}


def vllm_sample(kind: str, repeats: int, threads: int = 2) -> dict:
    """One process, one engine: ``plain`` (full and merged syncs alternating, decode speed) or
    ``adapter`` (adapter syncs, decode speed with the LoRA request)."""
    import copy

    import torch

    torch.set_num_threads(threads)
    from arlopti.config import LoraConfig, RolloutConfig
    from arlopti.models.lora import apply_lora
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import load_causal_lm, load_tokenizer
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.vllm import VLLMEngine

    tok = load_tokenizer(MODEL)
    base = load_causal_lm(MODEL, tok)
    full = PolicyLM(copy.deepcopy(base))
    lora = PolicyLM(apply_lora(base, LoraConfig(r=16)))
    with torch.no_grad():  # a trained-looking adapter (B = 0 would make merged == base)
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3, generator=torch.Generator().manual_seed(1))
    cfg = RolloutConfig(backend="vllm", max_new_tokens=64, max_model_len=512, sync_bucket_mb=256,
                        lora_sync="adapter" if kind == "adapter" else "merged")
    engine = VLLMEngine.from_policy(lora if kind == "adapter" else full, tok, cfg)
    versions = iter(range(10, 10_000))
    policies = {"adapter": lora} if kind == "adapter" else {"full": full, "merged": lora}
    syncs: dict[str, list[float]] = {k: [] for k in policies}
    for name in interleaved_order(list(policies), repeats):
        engine.sync_weights(policies[name], next(versions))
        syncs[name].append(engine.stats.last_sync_seconds)
    engine.extra_sampling_kwargs = {"min_tokens": 64}
    prompts = [tok(f"Question {i}: what is {i} plus {i}?")["input_ids"] for i in range(8)]
    tps = []
    for r in range(repeats):
        t0 = time.perf_counter()
        comps = engine.generate(prompts, 4, SamplingConfig(temperature=1.0, max_new_tokens=64, seed=r))
        n_tok = sum(len(c.token_ids) for cs in comps for c in cs)
        tps.append(n_tok / (time.perf_counter() - t0))
    engine.close()
    return {"sync_s": syncs, "tokens_per_s": tps}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"learner configurations, a subset of {list(CONFIGS)}")
    ap.add_argument("--model", default=MODEL, help="smollm2-135m-instruct, or tiny (the random test model)")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-learner", action="store_true", help="only the vLLM sync / decode part")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny model, batch 2 x 8 tokens, one sample each, no vLLM: a check that it runs")
    ap.add_argument("--out", default="bench_lora.json", help="file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.batch, args.tokens, args.repeats, args.skip_vllm = "tiny", 2, 8, 1, True
    elif args.repeats < 5:
        ap.error("--repeats must be >= 5 (the median of at least five samples is reported)")
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or not args.configs:
        ap.error(f"--configs: unknown {unknown}; choose from {list(CONFIGS)}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out: dict = {"args": vars(args)}
    if not args.skip_learner:
        learner_part(args, out)
    if not args.skip_vllm:
        vllm_part(args, out)
    print("wrote", write_json(args.out, out))
    return out


def learner_part(args, out: dict) -> None:
    """Peak RSS, update and step time: LoRA r=16 against full-parameter, alternating processes."""
    samples: dict[str, list[dict]] = {name: [] for name in args.configs}
    for name in interleaved_order(list(samples), args.repeats):
        r, full_ckpt, lora_ckpt = CONFIGS[name]
        samples[name].append(run_isolated(__file__, "learner_sample", {
            "lora_r": r, "batch": args.batch, "tokens": args.tokens, "model": args.model,
            "gradient_checkpointing": full_ckpt, "lora_checkpointing": lora_ckpt}))
    keys = ("peak_rss_mb", "update_s", "step_s")
    med = {n: {k: statistics.median(s[k] for s in rows) for k in keys} for n, rows in samples.items()}
    rows = [{"config": n, **{k: round(v, 3) for k, v in m.items()}, "trainable": samples[n][0]["trainable"],
             "reference copy": samples[n][0]["has_ref_copy"], "checkpointed": samples[n][0]["checkpointed"]}
            for n, m in med.items()]
    ratios = {f"{n}_over_{base}": {k: med[n][k] / med[base][k] if med[base][k] else None for k in keys}
              for n, base in (("lora_r16", "full"), ("lora_r16_auto", "full"), ("lora_r16_auto", "full_ckpt"),
                              ("lora_r16_auto", "lora_r16"), ("full_ckpt", "full")) if n in med and base in med}
    out.update(learner=samples, learner_median=med, learner_ratios=ratios)
    print(format_table(rows, ["config", *keys, "trainable", "reference copy", "checkpointed"]))
    for name, r in ratios.items():
        print(f"{name}:", {k: None if v is None else round(v, 3) for k, v in r.items()})


def vllm_part(args, out: dict) -> None:
    """Sync time (full, merged, adapter) and decode tokens/s (plain engine, LoRA engine)."""
    runs: dict[str, list[dict]] = {"plain": [], "adapter": []}
    for kind in interleaved_order(list(runs), 2):
        runs[kind].append(run_isolated(__file__, "vllm_sample", {"kind": kind, "repeats": args.repeats}))
    engine_of = {"full": "plain", "merged": "plain", "adapter": "adapter"}
    sync = {m: statistics.median(x for r in runs[kind] for x in r["sync_s"][m]) for m, kind in engine_of.items()}
    tps = {k: statistics.median(x for r in v for x in r["tokens_per_s"]) for k, v in runs.items()}
    out.update(vllm=runs, vllm_sync_median_s=sync, vllm_tokens_per_s_median=tps)
    print("vLLM sync (s, median):", {k: round(v, 4) for k, v in sync.items()},
          "| merged/full", round(sync["merged"] / sync["full"], 3),
          "| adapter/full", round(sync["adapter"] / sync["full"], 4))
    print("vLLM decode tokens/s (median):", {k: round(v, 1) for k, v in tps.items()},
          "| time per token adapter/plain", round(tps["plain"] / tps["adapter"], 3))


if __name__ == "__main__":
    main()
