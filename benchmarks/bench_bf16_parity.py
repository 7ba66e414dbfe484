"""bf16-mixed against fp32 on the same batches (issue 49): SmolLM2-135M-Instruct, the demo's cold start and a
GRPO + Lopti step, and where the two precisions part.

Every comparison starts from the same fp32 weights and feeds both precisions the same batches; ``bf16-mixed`` is
Lightning's own precision context (``MixedPrecision("bf16-mixed", "cpu").forward_context()``, what the trainer
and the cold-start callback enter). Variants (``VARIANTS``): ``fp32``; ``bf16``, bf16-mixed as the learner runs
it (its set-up spreads the fp32 masters within their bf16 rounding intervals); ``bf16-grid``, bf16-mixed with
the masters left on the bf16 grid as loaded from the bf16 checkpoint (the code before issue 49). Parts
(``--parts``; the first four by default):

* ``step0``: one cold-start batch at the initial weights. The loss, the per-token log-prob differences from
  fp32 by probability bucket (fp32's p; ``arlopti.plugins.buckets``) and the gradient's cosine and norm
  ratio against fp32 (all parameters, and by group) for bf16-mixed as the trainer runs it, for the naive
  log-prob path, for bf16-mixed with the LM-head GEMM kept in fp32 (the fused op's logits unrounded) and with
  the masters spread; plus the dtypes of the master weights, gradients, AdamW state and the clipped norm, and
  whether Lightning's autocast caches its weight casts.
* ``onestep``: one SFT step under bf16-mixed, then the loss of the next forward in bf16 and in fp32 at the new
  weights, and the share of the weights' bf16 casts the step changed, with the masters on the grid and spread.
* ``coldstart``: the demo's cold start (``experiment=kk_lopti_demo``: 6 steps, batch 8, lr 5e-5) per
  ``--seeds`` (offsets to ``callbacks.cold_start.seed``: which puzzles and batches; the demo's run seed does not
  reach the cold start), each variant on the first seed and fp32 and bf16 on the others; then bf16 against
  fp32's seed-to-seed range per step.
* ``grpo``: one rollout step of the demo's GRPO + Lopti learner (``GRPOModule`` under ``Trainer.fit``) on one
  fixed set of responses (sampled once in fp32 and replayed): per optimizer step (Lopti's low then high phase)
  the gradient's cosine against fp32's (the hook sees it clipped), the phases' losses and pre-clip norms, and
  logπ_old's differences by bucket.
* ``rates`` (not among the defaults): the machine's 1024^3 GEMM rates (fp32, bf16) and read bandwidth in
  ``--rounds`` interleaved rounds, median and spread (``arlopti.utils.machine`` via ``_common``); every run
  prints one measurement of each first.

Usage (under the CPU lock; about 5 min for step0 + onestep + grpo, 1.5 min per cold start):
  flock /tmp/arlopti-cpu.lock .venv/bin/python benchmarks/bench_bf16_parity.py --parts rates,step0,onestep,grpo
  flock /tmp/arlopti-cpu.lock .venv/bin/python benchmarks/bench_bf16_parity.py --parts coldstart --seeds 0,1,2
Output: tables on stdout and ``benchmarks/out/bench_bf16_parity.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from unittest import mock

from _common import format_table, gemm_rate, read_bandwidth, write_json

MODEL = "smollm2-135m-instruct"
DEMO = "experiment=kk_lopti_demo"
GROUPS = ("embed/head", "attention", "mlp", "norms")


# --------------------------------------------------------------------------------------------- set-up

def demo_configs(seed_offset: int = 0, model: str = MODEL, cold_steps: int | None = None):
    """``(RunConfig, ColdStartConfig)`` of ``experiment=kk_lopti_demo``, the cold start's seed moved by
    ``seed_offset``."""
    from omegaconf import OmegaConf

    from arlopti.config.compose import compose
    from arlopti.entry.train import run_config
    from arlopti.learner.cold_start import ColdStartConfig

    cfg = compose([DEMO, f"model.name_or_path={model}"])
    cold = OmegaConf.to_container(cfg.callbacks.cold_start, resolve=True)
    cold.pop("_target_", None)
    cold_cfg = ColdStartConfig(**cold)
    cold_cfg.seed += seed_offset
    if cold_steps is not None:
        cold_cfg.steps = cold_steps
    return run_config(cfg), cold_cfg


def load_policy(tok, name: str = MODEL):
    from arlopti.learner.policy import PolicyLM, disable_dropout
    from arlopti.models.loading import load_causal_lm

    model = load_causal_lm(name, tok, dtype="float32")
    disable_dropout(model)
    return PolicyLM(model, "fused")


def precision_context(precision: str):
    """Lightning's forward context for ``precision`` (``32-true`` or ``bf16-mixed``), as the trainer enters it."""
    if precision == "32-true":
        return contextlib.nullcontext()
    from lightning.pytorch.plugins.precision import MixedPrecision

    return MixedPrecision(precision, "cpu").forward_context()


@contextlib.contextmanager
def masters_on_grid():
    """The code before issue 49: the learner leaves the fp32 master weights on the bf16 grid."""
    with mock.patch("arlopti.learner.lifecycle.spread_master_weights", lambda *a, **k: 0):
        yield


#: name -> (precision, whether the masters are spread within their bf16 rounding intervals): fp32; bf16-mixed
#: as fixed; bf16-mixed with the masters left on the bf16 grid (the code before issue 49)
VARIANTS = {"fp32": ("32-true", False), "bf16": ("bf16-mixed", True), "bf16-grid": ("bf16-mixed", False)}


def variant_context(name: str):
    """The patch that makes the learner run as ``VARIANTS[name]`` says (none for the fixed code)."""
    return contextlib.nullcontext() if VARIANTS[name][1] or VARIANTS[name][0] == "32-true" else masters_on_grid()


@contextlib.contextmanager
def head_gemm_fp32():
    """The fused log-prob op's logits GEMM in fp32 under autocast (the logits never rounded to bf16)."""
    import torch

    with mock.patch("arlopti.ops.logprobs._gemm_dtype", lambda h, w: torch.float32):
        yield


@contextlib.contextmanager
def masters_spread(policy):
    """The policy's fp32 masters spread within their bf16 rounding intervals (the learner's set-up), then restored."""
    import torch

    from arlopti.utils.precision import spread_master_weights

    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    spread_master_weights(policy, torch.bfloat16)
    try:
        yield
    finally:
        policy.load_state_dict(state)


def group_of(name: str) -> str:
    if "embed" in name or "lm_head" in name:
        return "embed/head"
    if "norm" in name:
        return "norms"
    return "attention" if "self_attn" in name else "mlp"


def flat_grads(policy) -> dict:
    """Each group's gradients, flattened into one fp32 vector."""
    import torch

    parts: dict = {g: [] for g in GROUPS}
    for name, p in policy.named_parameters():
        if p.grad is not None:
            parts[group_of(name)].append(p.grad.detach().float().reshape(-1))
    return {g: torch.cat(v) for g, v in parts.items() if v}


def grad_compare(ref: dict, other: dict) -> dict:
    """Cosine and norm ratio of ``other``'s gradients against ``ref``'s: all of them, then by group."""
    import torch

    out = {}
    for g in ("all", *GROUPS):
        a = torch.cat(list(ref.values())) if g == "all" else ref[g]
        b = torch.cat(list(other.values())) if g == "all" else other[g]
        a, b = a.double(), b.double()  # a float32 dot product over 1e8 terms is off by percents
        out[f"cos_{g}"] = float(a @ b / (a.norm() * b.norm()))
        out[f"norm_ratio_{g}"] = float(b.norm() / a.norm())
    return out


def bucket_diffs(ref_logp, other_logp, mask) -> list[dict]:
    """Mean and max |Δ log p| of ``other`` against ``ref`` per bucket of ``ref``'s probability."""
    from arlopti.plugins.buckets import BUCKET_LABELS, bucket_index

    valid = mask.bool()
    b = bucket_index(ref_logp.exp())[valid]
    d = (other_logp - ref_logp).abs()[valid]
    rows = []
    for i, label in enumerate(BUCKET_LABELS):
        sel = d[b == i]
        rows.append({"bucket": label, "tokens": int(sel.numel()),
                     "mean_abs": float(sel.mean()) if sel.numel() else math.nan,
                     "max_abs": float(sel.max()) if sel.numel() else math.nan})
    sel = d
    rows.append({"bucket": "all", "tokens": int(sel.numel()), "mean_abs": float(sel.mean()),
                 "max_abs": float(sel.max())})
    return rows


# ------------------------------------------------------------------------------------------- step 0

def sft_forward(policy, batch, pad: int):
    """``(loss, logp [B, R], response mask)`` of the cold start's objective on ``batch``."""
    from arlopti.learner.experience import pad_prompt_response

    ids, attn, mask, p = pad_prompt_response([b[0] for b in batch], [b[1] for b in batch], pad)
    logp, _ = policy(ids, attn, p, 1.0, with_entropy=False)
    return -(logp * mask).sum() / mask.sum().clamp(min=1), logp, mask


def step0_variant(policy, batch, pad: int, precision: str, patch) -> dict:
    """Loss, log-probs and gradients of one forward + backward at the current weights."""
    policy.zero_grad(set_to_none=True)
    with patch, precision_context(precision):
        loss, logp, mask = sft_forward(policy, batch, pad)
        loss.backward()
    return {"loss": float(loss), "loss_dtype": str(loss.dtype), "logp": logp.detach(), "mask": mask,
            "grads": flat_grads(policy)}


def step0(tok, policy, cold_cfg) -> dict:
    """The ``step0`` part (module docstring)."""
    import random

    from arlopti.learner.cold_start import sft_examples

    pad = tok.pad_token_id
    batch = random.Random(cold_cfg.seed).sample(sft_examples(tok, cold_cfg), cold_cfg.batch_size)
    variants = {"fp32": ("32-true", contextlib.nullcontext(), "fused"),
                "bf16-mixed (fused, as trained)": ("bf16-mixed", contextlib.nullcontext(), "fused"),
                "bf16-mixed, naive log-probs": ("bf16-mixed", contextlib.nullcontext(), "naive"),
                "bf16-mixed, LM-head GEMM fp32": ("bf16-mixed", head_gemm_fp32(), "fused"),
                "bf16-mixed, masters spread": ("bf16-mixed", masters_spread(policy), "fused")}
    results = {}
    for name, (precision, patch, impl) in variants.items():
        policy.logprob_impl = impl
        results[name] = step0_variant(policy, batch, pad, precision, patch)
    policy.logprob_impl = "fused"
    ref = results["fp32"]
    rows, buckets = [], {}
    for name, r in results.items():
        rows.append({"variant": name, "loss": r["loss"], "loss_dtype": r["loss_dtype"],
                     **grad_compare(ref["grads"], r["grads"])})
        if name != "fp32":
            buckets[name] = bucket_diffs(ref["logp"], r["logp"], r["mask"])
    return {"rows": rows, "buckets": buckets, "dtypes": optimizer_dtypes(policy, batch, pad)}


def optimizer_dtypes(policy, batch, pad: int) -> dict:
    """One bf16-mixed SFT step's dtypes: master weights, gradients, AdamW state and the clipped norm (then undone)."""
    import torch

    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-5)
    with precision_context("bf16-mixed"):
        cache_enabled = torch.is_autocast_cache_enabled()  # False: no bf16 cast outlives the op that made it
        policy.zero_grad(set_to_none=True)
        sft_forward(policy, batch, pad)[0].backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    out = {"weights": sorted({str(p.dtype) for p in params}), "grads": sorted({str(p.grad.dtype) for p in params}),
           "adam_state": sorted({str(t.dtype) for s in opt.state.values() for t in s.values() if t.dim()}),
           "clip_norm": str(norm.dtype), "lightning_autocast_cache": cache_enabled}
    policy.load_state_dict(state)
    policy.zero_grad(set_to_none=True)
    return out


# ----------------------------------------------------------------------------------------- one step

def one_bf16_step(policy, batch, pad: int, cold_cfg) -> tuple[float, float]:
    """One cold-start step under bf16-mixed: ``(loss before, share of the weights' bf16 casts the step changed)``."""
    import torch

    params = [p for p in policy.parameters() if p.requires_grad]
    casts = [p.detach().to(torch.bfloat16) for p in params]
    opt = torch.optim.AdamW(params, lr=cold_cfg.lr)
    with precision_context("bf16-mixed"):
        loss0 = sft_forward(policy, batch, pad)[0]
        loss0.backward()
        torch.nn.utils.clip_grad_norm_(params, cold_cfg.grad_clip)
        opt.step()
    changed = sum(int((p.detach().to(torch.bfloat16) != c).sum()) for p, c in zip(params, casts))
    return float(loss0), changed / sum(c.numel() for c in casts)


def onestep(tok, policy, cold_cfg) -> dict:
    """The ``onestep`` part: one SFT step, then the loss of the next forward in bf16 and fp32, by where the
    masters stand (on the bf16 grid as loaded, or spread)."""
    import random

    import torch

    from arlopti.learner.cold_start import sft_examples
    from arlopti.utils.precision import spread_master_weights

    pad = tok.pad_token_id
    batch = random.Random(cold_cfg.seed).sample(sft_examples(tok, cold_cfg), cold_cfg.batch_size)
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    out = {}
    for spread in (False, True):
        where = "spread" if spread else "on the bf16 grid"
        policy.load_state_dict(state)
        policy.zero_grad(set_to_none=True)
        if spread:
            spread_master_weights(policy, torch.bfloat16)
        before, changed = one_bf16_step(policy, batch, pad, cold_cfg)
        out[f"masters {where}: before the step, bf16"] = before
        with torch.no_grad(), precision_context("bf16-mixed"):
            out[f"masters {where}: after, bf16"] = float(sft_forward(policy, batch, pad)[0])
        with torch.no_grad():
            out[f"masters {where}: after, fp32"] = float(sft_forward(policy, batch, pad)[0])
        out[f"masters {where}: share of bf16 casts the step changed"] = changed
    policy.load_state_dict(state)
    policy.zero_grad(set_to_none=True)
    return out


# --------------------------------------------------------------------------------------- cold start

def cold_start_curve(tok, policy, cold_cfg, variant: str) -> list[float]:
    """The cold start's per-step losses from the current weights (restored afterwards) as a training run with
    the ``variant`` makes them: the learner's set-up (its spread of the masters), then the callback's warm-up."""
    from arlopti.learner.cold_start import run_cold_start
    from arlopti.utils.precision import mixed_compute_dtype, spread_master_weights

    precision, spread = VARIANTS[variant]
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    if spread:
        spread_master_weights(policy, mixed_compute_dtype(precision))
    with variant_context(variant), precision_context(precision):
        losses = run_cold_start(policy, tok, cold_cfg)
    policy.load_state_dict(state)
    policy.zero_grad(set_to_none=True)
    return losses


def cold_start(tok, policy, seeds: list[int], variants: list[str], args) -> dict:
    """The ``coldstart`` part: one curve per seed and variant, with its wall time."""
    curves = []
    for i, seed in enumerate(seeds):
        _, cold_cfg = demo_configs(seed, args.model, args.cold_steps)
        for name in (variants if i == 0 else [v for v in variants if v in ("fp32", "bf16")]):
            t0 = time.perf_counter()
            losses = cold_start_curve(tok, policy, cold_cfg, name)
            curves.append({"seed": seed, "variant": name, "losses": losses, "seconds": time.perf_counter() - t0})
            print(f"  seed {seed} {name}: {' '.join(f'{x:.3f}' for x in losses)} ({curves[-1]['seconds']:.0f} s)",
                  flush=True)
    return {"curves": curves, "summary": curve_summary(curves)}


def curve_summary(curves: list[dict], variant: str = "bf16") -> list[dict]:
    """Per cold-start step: fp32's and ``variant``'s mean and range over the seeds both ran, the largest paired
    (same seed, same batches) difference, and whether ``variant``'s mean lies within fp32's range."""
    by = {(c["variant"], c["seed"]): c["losses"] for c in curves}
    seeds = sorted({s for v, s in by if v == variant and ("fp32", s) in by})
    if not seeds:
        return []
    rows = []
    for k in range(len(by[("fp32", seeds[0])])):
        ref, got = [by[("fp32", s)][k] for s in seeds], [by[(variant, s)][k] for s in seeds]
        mean = sum(got) / len(got)
        rows.append({"step": k + 1, "fp32_mean": sum(ref) / len(ref), "fp32_min": min(ref), "fp32_max": max(ref),
                     f"{variant}_mean": mean, f"{variant}_min": min(got), f"{variant}_max": max(got),
                     "max_paired_diff": max(abs(a - b) for a, b in zip(ref, got)),
                     "within": min(ref) <= mean <= max(ref)})
    return rows


# --------------------------------------------------------------------------------------------- GRPO

def replay_engine(engine):
    """A rollout engine that asks ``engine`` once per prompt and replays those completions ever after."""
    from arlopti.rollout.engine import RolloutEngine

    class Replay(RolloutEngine):
        def __init__(self):
            super().__init__()
            self.seen: dict = {}

        def generate(self, prompt_ids, n, sampling):
            todo = [p for p in prompt_ids if tuple(p) not in self.seen]
            if todo:
                for p, row in zip(todo, engine.generate(todo, n, sampling)):
                    self.seen[tuple(p)] = row
            return [self.seen[tuple(p)] for p in prompt_ids]

    return Replay()


class GradRecorder:
    """Each optimizer step's (clipped) gradients by group, taken by a pre-step hook on the learner's optimizer."""

    def __init__(self):
        self.steps: list[dict] = []

    def attach(self, module):
        import lightning.pytorch as L

        rec = self

        class Attach(L.Callback):
            def on_train_start(self, trainer, pl_module):
                trainer.optimizers[0].register_step_pre_hook(
                    lambda opt, a, k: rec.steps.append(flat_grads(module.policy)))

        return Attach()


def grpo_run(tok, run_cfg, init_state, engine, variant: str) -> dict:
    """One rollout step of the demo's learner as ``variant`` from ``init_state`` on the replayed responses."""
    import lightning.pytorch as L

    from _common import bench_datamodule

    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.learner.module import GRPOModule

    module = GRPOModule(run_cfg, tokenizer=tok, total_rollout_steps=1)
    module.policy.load_state_dict(init_state)
    module.rollout_engine = engine
    rec = GradRecorder()
    s = run_cfg.sizes
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, precision=VARIANTS[variant][0],
                        callbacks=[rec.attach(module), RolloutCallback(group_size=s.group_size)])
    with variant_context(variant):
        trainer.fit(module, datamodule=bench_datamodule(tok, s.prompts_per_step, 1))
    ctx = module.last_step_context
    phase_losses = {k: v for k, v in ctx.metrics.items() if k.startswith("update/") and k.endswith("/loss")}
    return {"grads": rec.steps, "old": ctx.old_log_probs, "mask": ctx.experience.response_mask,
            "losses": phase_losses, "grad_norms": {k: v for k, v in ctx.metrics.items() if k.endswith("/grad_norm")}}


def grpo(tok, policy, tokens: int, variants: list[str], model: str) -> dict:
    """The ``grpo`` part (module docstring)."""
    from dataclasses import replace

    from arlopti.rollout.hf import HFEngine

    run_cfg, _ = demo_configs(model=model)
    run_cfg = replace(run_cfg, rollout=replace(run_cfg.rollout, max_new_tokens=tokens))
    init_state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    engine = replay_engine(HFEngine(policy.hf, tok, generation_batch_size=8))
    runs = {name: grpo_run(tok, run_cfg, init_state, engine, name) for name in variants}
    ref = runs["fp32"]
    rows, buckets = [], {}
    for name, r in runs.items():
        for i, grads in enumerate(r["grads"]):
            rows.append({"variant": name, "optimizer_step": i + 1, **grad_compare(ref["grads"][i], grads)})
        if name != "fp32":
            buckets[name] = bucket_diffs(ref["old"], r["old"], r["mask"])
    losses = [{"variant": name, **r["losses"], **r["grad_norms"]} for name, r in runs.items()]
    return {"rows": rows, "buckets": buckets, "losses": losses}


# --------------------------------------------------------------------------------------------- main

def machine_rates() -> dict:
    """The machine's GEMM rates (1024³, best of 5; fp32 and bf16) and read bandwidth, measured now."""
    import torch

    return {"gemm_fp32_gflops": gemm_rate(1024, torch.float32, 5) / 1e9,
            "gemm_bf16_gflops": gemm_rate(1024, torch.bfloat16, 5) / 1e9,
            "read_gbps": read_bandwidth(1024, 5) / 1e9}


def rates_rounds(rounds: int) -> dict:
    """The ``rates`` part: :func:`machine_rates`'s three measurements in ``rounds`` rounds, interleaved (the order
    rotates each round); per rate the median, the spread (min-max) and every sample."""
    import statistics

    import torch

    from _common import interleaved_order

    fns = {"gemm_fp32_gflops": lambda: gemm_rate(1024, torch.float32, 5) / 1e9,
           "gemm_bf16_gflops": lambda: gemm_rate(1024, torch.bfloat16, 5) / 1e9,
           "read_gbps": lambda: read_bandwidth(1024, 5) / 1e9}
    samples: dict = {k: [] for k in fns}
    for name in interleaved_order(list(fns), rounds):
        samples[name].append(fns[name]())
    out = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "samples": v} for k, v in samples.items()}
    ratio = [b / f for b, f in zip(samples["gemm_bf16_gflops"], samples["gemm_fp32_gflops"])]
    out["bf16_over_fp32"] = {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio), "samples": ratio}
    return out


def print_part(name: str, result: dict) -> None:
    if name == "rates":
        print(f"\n[rates] {len(result['read_gbps']['samples'])} interleaved rounds: median (min-max)")
        for k, v in result.items():
            print(f"  {k:<18} {v['median']:8.2f} ({v['min']:.2f}-{v['max']:.2f})")
        return
    cols_grad = ["variant", *(["optimizer_step"] if name == "grpo" else ["loss"]), "cos_all", "norm_ratio_all",
                 *(f"cos_{g}" for g in GROUPS)]
    if "rows" in result:
        print(f"\n[{name}] gradients against fp32's (cosine; norm ratio)")
        print(format_table(result["rows"], cols_grad))
    for variant, rows in result.get("buckets", {}).items():
        print(f"\n[{name}] |Δ log p| against fp32, by fp32's p: {variant}")
        print(format_table(rows, ["bucket", "tokens", "mean_abs", "max_abs"]))
    for key in ("dtypes", "losses"):
        if key in result:
            print(f"\n[{name}] {key}")
            print(result[key] if isinstance(result[key], dict) else "\n".join(map(str, result[key])))
    if "curves" in result:
        print(f"\n[{name}] per-step losses")
        for c in result["curves"]:
            print(f"seed {c['seed']}  {c['variant']:<12} " + " ".join(f"{x:.3f}" for x in c["losses"]))
        if result["summary"]:
            print(f"\n[{name}] bf16 against fp32's seed-to-seed range, per step")
            print(format_table(result["summary"], list(result["summary"][0])))
    if name == "onestep":
        print(f"\n[{name}] the cold start's first batch, one bf16-mixed step")
        for k, v in result.items():
            print(f"  {k:<62} {v:.5f}")


def strip_tensors(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("grads", "old", "mask", "logp")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="step0,onestep,coldstart,grpo", help="comma-separated parts (docstring; "
                                                                              "also rates)")
    parser.add_argument("--seeds", default="0,1,2", help="coldstart: offsets added to callbacks.cold_start.seed")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"coldstart and grpo: which of {list(VARIANTS)} (VARIANTS; fp32 always first); "
                             "coldstart runs them on the first seed, fp32 and bf16 on the others")
    parser.add_argument("--grpo-tokens", type=int, default=64, help="grpo: response length (the demo samples 128)")
    parser.add_argument("--model", default=MODEL, help="the demo's, or tiny (a random test model: measures nothing)")
    parser.add_argument("--cold-steps", type=int, default=None, help="cold-start steps (default: the demo's)")
    parser.add_argument("--rounds", type=int, default=5, help="rates: interleaved rounds of the three measurements")
    parser.add_argument("--out", default="bench_bf16_parity.json")
    args = parser.parse_args(argv)
    import torch

    from arlopti.models.loading import load_tokenizer

    torch.manual_seed(0)
    rates = machine_rates()
    print(f"GEMM 1024^3 best of 5: fp32 {rates['gemm_fp32_gflops']:.1f}, bf16 {rates['gemm_bf16_gflops']:.1f} "
          f"GFLOP/s; read {rates['read_gbps']:.1f} GB/s", flush=True)
    tok = load_tokenizer(args.model)
    policy = load_policy(tok, args.model)
    _, cold_cfg = demo_configs(model=args.model, cold_steps=args.cold_steps)
    variants = ["fp32", *(v for v in args.variants.split(",") if v != "fp32")]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; use names from {list(VARIANTS)}")
    out = {"rates": rates}
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        if part == "rates":
            result = rates_rounds(args.rounds)
        elif part == "step0":
            result = step0(tok, policy, cold_cfg)
        elif part == "onestep":
            result = onestep(tok, policy, cold_cfg)
        elif part == "coldstart":
            result = cold_start(tok, policy, [int(s) for s in args.seeds.split(",")], variants, args)
        elif part == "grpo":
            result = grpo(tok, policy, args.grpo_tokens, variants, args.model)
        else:
            raise SystemExit(f"--parts: unknown part {part!r}; use rates, step0, onestep, coldstart, grpo")
        print_part(part, result)
        out[part] = {**strip_tensors(result), "seconds": time.perf_counter() - t0}
    print(f"\nwrote {write_json(args.out, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
