"""GPU check at real sizes without weights: Qwen2.5-1.5B and -3B built from their configs, random weights.

    PYTHONPATH=src python benchmarks/gpu_check_scale.py [--dry-run] [--out DIR] [--configs DIR]
    python benchmarks/gpu_check_scale.py --export-configs DIR     # what gpu_check.sh --prepare carries

The shapes are :mod:`memory_plan`'s (``MODELS["3b"]``, and :data:`QWEN25_1_5B`: the published
config.json of Qwen2.5-1.5B-Instruct); ``--export-configs`` writes them as transformers config.json
files (a few KB; no weights, no tokenizer), which the device reads from ``--configs``. Each model is
built on the device from its config with random weights (``from_config`` under ``torch.device``),
as the paper runs train it: ``trainer=fsdp_bf16`` on one rank (FSDP2, bf16 compute, fp32 master
weights, gradients, reduce-scatter and AdamW state, activation checkpointing), the frozen reference
in bf16 (``algorithm.kl_coef=0.001``), fused log-probs. Rollouts come from a fixed-length engine
(``_common.fixed_length_engine``: no generation in the update), ``--prompts`` × ``--group`` responses of
exactly ``--length`` tokens after a short prompt, one mini-batch, micro-batches of ``--micro``.
Measured in this run, per size (stages, each PASS / FAIL / SKIP with its numbers):

* ``peaks``: the bf16 GEMM rate (``--gemm``³, best of 5 timings of 10 products) and the HBM read
  rate (``sum`` over a 2 GiB bf16 tensor, best of 5);
* ``grpo``: 1 warm-up + ``--steps`` GRPO steps: ``timing/update_s`` (forward + backward of every
  micro-batch + AdamW) and ``timing/logprobs_s`` (the reference pass); **MFU** = the update's model
  FLOPs (``bench_mfu``'s count: 6·N_body·T + 6·V·H·T_resp + 12·L·H·ΣS²) / median update time / the bf16
  GEMM rate (goal >= 0.40); HFU adds the recompute of activation checkpointing (one more forward,
  2·N_body·T + 4·L·H·ΣS²); peak memory (``max_memory_allocated`` over the fit) against
  ``memory_plan.plan``'s update peak for 1 GPU less its CUDA-context term (which the allocator
  does not see);
* ``sync``: the policy's weights (gathered, cast to bf16, 256 MB buckets: ``rollout.weight_sync``)
  copied into a second bf16 copy of the model (what an engine holds), 1 warm-up + 5, median;
  its share of a step = sync / (sync + generation + update phase), generation estimated as
  ``--length`` decoding steps at the step's batch (``decode``'s ms per step at that batch);
* ``decode``: the HF engine (``rollout.hf``, its default decoder) on that bf16 copy, ``--decode-tokens``
  tokens per response (EOS banned) at batch ``--decode-batches``: ms per decoding step, tokens/s, and
  the HBM limit of a step, (weight bytes + the KV cache read at the mean context) / the HBM rate;
* ``lopti``: the same steps with Lopti, eta = 1/V: a random model's p_old sits around 1/V, so both phases
  hold tokens (``low_token_frac``; the paper's 0.5 would put every token in the low phase and skip the
  high one); the Lopti / GRPO ratio of the update and of the update phase (update + log-prob passes).

First, ``configs``: every carried config.json (``--configs``) is read back and compared with its
shape (parameter count included), on the device and in the dry run. Time: ``--budget-s`` (default
170, counted from the start of ``main``: the imports come before) bounds the part; a stage that would start with less than its reserve left is skipped (SKIP,
said why); the JSON is rewritten after every stage, so a timeout still leaves what ran.
``--dry-run`` (``gpu_check.sh --cpu-dry-run``): the same stages on the CPU at two tiny sizes (gloo,
no memory or rate verdicts), for tests/benchmarks/test_gpu_check_scale.py. Last line
``GPU CHECK SCALE: PASS`` (every stage that ran passed: numbers finite, steps taken) or ``FAIL``;
``<out>/gpu_check_scale.json``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # memory_plan, _common: beside this file
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import memory_plan as mp  # noqa: E402

#: Qwen2.5-1.5B(-Instruct)'s config.json shape (28 layers of 1536, 12 heads / 2 KV heads, SwiGLU 8960,
#: 151,936 tokens, tied embeddings): 1.54 B parameters, 1.31 B without the embedding.
QWEN25_1_5B = mp.Shape("Qwen2.5-1.5B-Instruct", hidden=1536, layers=28, intermediate=8960, heads=12, kv_heads=2,
                       vocab=151936, tied=True)
SIZES = {"qwen2.5-1.5b": QWEN25_1_5B, "qwen2.5-3b": mp.MODELS["3b"]}
#: The dry run's stand-ins (the same code path at sizes two CPU cores finish in seconds).
DRY_SIZES = {"tiny-a": mp.Shape("tiny-a", hidden=64, layers=2, intermediate=128, heads=4, kv_heads=2, vocab=512,
                                tied=True),
             "tiny-b": mp.Shape("tiny-b", hidden=96, layers=2, intermediate=192, heads=4, kv_heads=2, vocab=512,
                                tied=True)}
RESERVE_S = {"grpo": 35.0, "sync": 5.0, "decode": 10.0, "lopti": 30.0}  # left needed to start a stage (3B)
REPORT: dict = {"stages": {}, "sizes": {}}


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "tie_word_embeddings")


def config_dict(shape: mp.Shape) -> dict:
    """The transformers Qwen2 config.json fields that define the shape (the rest: transformers' defaults)."""
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": shape.hidden,
            "num_hidden_layers": shape.layers, "intermediate_size": shape.intermediate,
            "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab,
            "tie_word_embeddings": shape.tied, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "max_position_embeddings": 32768, "use_sliding_window": False, "attention_dropout": 0.0,
            "torch_dtype": "bfloat16",
            # Qwen2.5's <|endoftext|> and <|im_end|>; a stand-in vocabulary below them has none
            **({"bos_token_id": 151643, "eos_token_id": 151645} if shape.vocab > 151645 else {})}


def export_configs(folder: Path) -> list[Path]:
    """``folder/<size>/config.json`` for every real size (validated by transformers' Qwen2Config)."""
    from transformers import Qwen2Config

    paths = []
    for name, shape in SIZES.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        path = folder / name / "config.json"
        Qwen2Config(**{k: v for k, v in config_dict(shape).items() if k not in ("architectures", "model_type")}) \
            .save_pretrained(folder / name)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------- timing
def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def gemm_tflops(n: int, device: str, reps: int = 10, trials: int = 5) -> float:
    """Best of ``trials`` of the mean rate of ``reps`` back-to-back bf16 ``n³`` products (2·n³ FLOPs each)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    best = math.inf
    for _ in range(trials):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * n**3 / best / 1e12


def read_gb_per_s(gib: float, device: str, trials: int = 5) -> float:
    """Best rate of ``x.sum()`` over a ``gib`` GiB bf16 tensor: memory only read, as a decoding step reads weights."""
    import torch

    x = torch.ones(int(gib * 2**30) // 2, device=device, dtype=torch.bfloat16)
    x.sum()
    best = math.inf
    for _ in range(trials):
        _sync(device)
        t0 = time.perf_counter()
        x.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 2 / best / 1e9


# ---------------------------------------------------------------------------------------------- models
def load_config(name: str, shape: mp.Shape, configs: Path | None):
    """The size's transformers config: ``configs/<name>/config.json`` (the carried file) when given,
    else built from the shape (the dry run; ``--configs`` is what gpu_check.sh passes on the device)."""
    from transformers import AutoConfig, Qwen2Config

    if configs is not None:
        path = configs / name / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run `bash benchmarks/gpu_check.sh --prepare` and carry "
                                    ".gpu_check (or pass --configs to a folder written by --export-configs)")
        return AutoConfig.from_pretrained(str(path.parent))
    return Qwen2Config(**{k: v for k, v in config_dict(shape).items() if k not in ("architectures", "model_type")})


def check_configs(folder: Path) -> dict:
    """Each real size's carried config.json against its shape: the fields that set it, and the parameter
    count of the model it builds (on the meta device: no memory, no time)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    for name, shape in SIZES.items():
        config = load_config(name, shape, folder)
        want = config_dict(shape)
        bad = {k: (getattr(config, k, None), want[k]) for k in SHAPE_KEYS if getattr(config, k, None) != want[k]}
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if bad or params != shape.params:
            raise ValueError(f"{folder / name / 'config.json'} is not the {shape.name} shape: {bad}, "
                             f"{params:,} parameters built vs {shape.params:,}")
        out[name] = {"params": params, "file_bytes": (folder / name / "config.json").stat().st_size}
    return out


def build_model(config, dtype, device: str):
    """Random weights from ``config``, built on ``device`` (no CPU detour)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def learner_class(config, device: str):
    """``GRPOModule`` whose policy and reference are built from ``config`` on ``device`` (the learner loads
    a named or saved model otherwise; there are no weights here)."""
    from arlopti.learner.module import GRPOModule
    from arlopti.learner.policy import disable_dropout
    from arlopti.utils.dtypes import torch_dtype

    class FromConfig(GRPOModule):
        def _load_model(self, dtype: str):
            model = build_model(config, torch_dtype(dtype, "model.dtype"), device)
            disable_dropout(model)
            return model

    return FromConfig


def run_cfg(args, lopti: bool, vocab: int):
    from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)

    n = args.prompts * args.group
    return RunConfig(algorithm=AlgorithmConfig(kl_coef=0.001, lopti=LoptiConfig(enabled=lopti, eta=1.0 / vocab)),
                     optim=OptimConfig(lr=1e-6),
                     sizes=SizesConfig(prompts_per_step=args.prompts, group_size=args.group, mini_batch_size=n,
                                       micro_batch_size=args.micro, logprob_micro_batch_size=2 * args.micro),
                     model=ModelConfig(name_or_path="from-config", ref_dtype="bfloat16", logprob_impl="fused"),
                     rollout=RolloutConfig(temperature=1.0, max_new_tokens=args.length))


def fit(args, config, tok, lopti: bool, device: str):
    """1 warm-up + ``args.steps`` steps of the learner under FSDP2 bf16 on one rank; returns
    (module, per-step metrics, peak allocated bytes or None)."""
    import lightning.pytorch as L
    import torch

    from _common import bench_datamodule, fixed_length_engine
    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.learner.sharding import FSDP2Strategy

    steps = 1 + args.steps
    L.seed_everything(0, verbose=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    module = learner_class(config, device)(run_cfg(args, lopti, config.vocab_size), tokenizer=tok, total_rollout_steps=steps)
    module.rollout_engine = fixed_length_engine(tok, lambda i, j: args.length)
    rows: list[dict] = []

    class Rows(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *a):
            rows.append(dict(pl_module.last_step_context.metrics))

    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_epochs=1, logger=False,
                        strategy=FSDP2Strategy(mixed_precision="bf16", activation_checkpointing=True),
                        precision="32-true", enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=args.group), Rows()])
    trainer.fit(module, datamodule=bench_datamodule(tok, args.prompts, steps))
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return module, rows[1:], peak


def model_flops(shape: mp.Shape, rows: int, prompt_len: int, length: int) -> dict:
    """One update's FLOPs (bench_mfu's count) and the recompute activation checkpointing adds."""
    n_body = shape.layers * shape.layer_params + shape.hidden  # the final norm; the tied head is its own term
    s_row = prompt_len + length
    t_all, t_resp = rows * s_row, rows * length
    attn = 12 * shape.layers * shape.hidden * rows * s_row**2
    model = 6 * n_body * t_all + 6 * shape.vocab * shape.hidden * t_resp + attn
    return {"model": model, "recompute": 2 * n_body * t_all + attn // 3}


# ---------------------------------------------------------------------------------------------- stages
def time_sync(policy, engine, device: str, repeats: int = 5) -> dict:
    """Copy the policy's weights into ``engine`` (a bf16 model) as a sync does: names checked, 256 MB
    buckets, gathered and cast (``rollout.weight_sync``); 1 warm-up, then ``repeats`` timed copies."""
    import torch

    from arlopti.rollout.weight_sync import check_names, named_sync_params, stream_tensors

    tied = bool(getattr(engine.config, "tie_word_embeddings", False))
    items = named_sync_params(policy.named_parameters(), tied)
    target = dict(named_sync_params(engine.named_parameters(), tied))
    check_names([n for n, _ in items], target, where="the engine copy")
    times = []
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, tensor in stream_tensors(items, 256 * 2**20, dtype=torch.bfloat16):
                target[name].copy_(tensor)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "seconds": times, "tensors": len(items),
            "bytes": sum(p.numel() * 2 for p in target.values())}


def time_decode(engine, tok, shape: mp.Shape, batch: int, tokens: int, hbm_gb_s: float, device: str) -> dict:
    """The HF engine on ``engine``: ``batch`` responses of exactly ``tokens`` tokens (1 warm-up call, 2 timed),
    ms per decoding step and its HBM limit (weights + the KV cache at the mean context, read once per step)."""
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.hf import HFEngine

    prompts = [tok(f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?")["input_ids"]
               for i in range(batch)]
    hf = HFEngine(engine, tok, generation_batch_size=batch, min_new_tokens=tokens)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=tokens, seed=0)
    fallback = None
    try:
        hf.generate(prompts, 1, sampling)
    except Exception as err:  # noqa: BLE001 - the default decoder never ran on CUDA before: say so, time the loop
        fallback = f"{hf.decoder}: {type(err).__name__}: {err}"
        traceback.print_exc()
        hf.decoder = "forward"
        hf.generate(prompts, 1, sampling)
    times = []
    for _ in range(2):
        _sync(device)
        t0 = time.perf_counter()
        out = hf.generate(prompts, 1, sampling)
        _sync(device)
        times.append(time.perf_counter() - t0)
        got = {len(c.token_ids) for cs in out for c in cs}
        if got != {tokens}:
            raise RuntimeError(f"HFEngine: response lengths {sorted(got)} != {tokens}")
    step_s = min(times) / tokens
    weights = sum(p.numel() * p.element_size() for p in engine.parameters())
    context = statistics.fmean(len(p) for p in prompts) + tokens / 2
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2 * batch * context  # K and V in bf16
    limit_s = (weights + kv) / (hbm_gb_s * 1e9)
    return {"batch": batch, "new_tokens": tokens, "ms_per_step": 1e3 * step_s, "tok_per_s": batch / step_s,
            "limit_ms_per_step": 1e3 * limit_s, "limit_tok_per_s": batch / limit_s, "of_limit": limit_s / step_s,
            "decoder": hf.decoder, "default_decoder_failed": fallback, "seconds": times}


class Budget:
    """The part's time: a stage starts only with its reserve left (scaled to the model's size)."""

    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def stage(name: str, budget: Budget, reserve: float, fn):
    """Run ``fn()`` as stage ``name`` unless less than ``reserve`` seconds are left; record its status."""
    if budget.left() < reserve:
        REPORT["stages"][name] = {"status": "SKIP", "why": f"{budget.left():.0f} s left of the budget, "
                                                           f"{reserve:.0f} s needed"}
        print(f"SKIP {name}: {REPORT['stages'][name]['why']}", flush=True)
        return None
    t0 = time.perf_counter()
    try:
        result = fn()
        REPORT["stages"][name] = {"status": "PASS", "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as err:  # noqa: BLE001 - reported, and the next stage still runs
        traceback.print_exc()
        REPORT["stages"][name] = {"status": "FAIL", "seconds": round(time.perf_counter() - t0, 1),
                                  "error": f"{type(err).__name__}: {err}"}
        result = None
    return result


def median_of(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows]
    if not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
        raise RuntimeError(f"{key}: {vals} (no finite values)")
    return statistics.median(vals)


def learner_stage(args, name, shape, config, tok, device, lopti: bool, rec: dict, peaks: dict):
    """One fit (GRPO or Lopti): medians, GRPO's MFU and memory, Lopti's ratio to GRPO."""
    module, rows, peak = fit(args, config, tok, lopti, device)
    steps = statistics.median(r["update/steps"] for r in rows)  # every optimizer step (the phases: update/low|high)
    out = {"update_s": [r["timing/update_s"] for r in rows], "update_s_median": median_of(rows, "timing/update_s"),
           "logprobs_s_median": median_of(rows, "timing/logprobs_s"), "optimizer_steps_per_rollout": steps,
           "n": len(rows)}
    out["phase_s_median"] = out["update_s_median"] + out["logprobs_s_median"]
    if lopti:
        out["low_token_frac"] = statistics.median(r["lopti/low_tokens"] / max(1.0, r["lopti/low_tokens"]
                                                                             + r["lopti/high_tokens"]) for r in rows)
    prompt_len = module.last_step_context.experience.prompt_len
    rec["workload"] = {"responses": args.prompts * args.group, "prompt_len": prompt_len, "length": args.length,
                       "micro": args.micro}
    if not lopti:
        flops = model_flops(shape, args.prompts * args.group, prompt_len, args.length)
        rate = flops["model"] / out["update_s_median"]
        out.update(model_tflop=flops["model"] / 1e12, achieved_tflops=rate / 1e12,
                   mfu=rate / (peaks["bf16_gemm_tflops"] * 1e12),
                   hfu=(flops["model"] + flops["recompute"]) / out["update_s_median"] / (peaks["bf16_gemm_tflops"] * 1e12))
        out["mfu_goal_0.40_met"] = out["mfu"] >= 0.40
        plan = mp.plan(shape, 1, 0.0, args.micro, prompt_len + args.length)
        predicted = (plan["update"] - mp.CONTEXT_GB) * 1e9
        rec["memory"] = {"peak_allocated_gb": None if peak is None else peak / 1e9, "predicted_gb": predicted / 1e9,
                         "measured_over_predicted": None if peak is None else peak / predicted}
    else:
        grpo = rec.get("grpo") or {}
        if "update_s_median" in grpo:
            rec["lopti_over_grpo"] = {"update": out["update_s_median"] / grpo["update_s_median"],
                                      "update_phase": out["phase_s_median"] / grpo["phase_s_median"]}
    rec["lopti" if lopti else "grpo"] = out
    return module


def run_size(args, name: str, shape: mp.Shape, tok, device: str, budget: Budget, peaks: dict) -> None:
    """The stages of one size, in order; the policy lives from the GRPO fit to the end of decoding."""
    scale = 1.0 if args.dry_run else shape.params / mp.MODELS["3b"].params
    rec = REPORT["sizes"].setdefault(name, {"params": shape.params, "config": config_dict(shape)})
    config = load_config(name, shape, None if args.dry_run else args.configs)
    module = stage(f"{name}/grpo", budget, RESERVE_S["grpo"] * scale,
                   lambda: learner_stage(args, name, shape, config, tok, device, False, rec, peaks))
    write_report(args)
    if module is not None:
        engine_stages(args, name, shape, config, tok, device, budget, peaks, rec, module.policy, scale)
    del module
    free(device)
    write_report(args)
    stage(f"{name}/lopti", budget, RESERVE_S["lopti"] * scale,
          lambda: learner_stage(args, name, shape, config, tok, device, True, rec, peaks))
    free(device)
    write_report(args)


def engine_stages(args, name, shape, config, tok, device, budget, peaks, rec, policy, scale) -> None:
    """A second bf16 copy of the model (an engine's weights): the sync into it, then decoding on it."""
    import torch

    engine = stage(f"{name}/engine_copy", budget, RESERVE_S["sync"] * scale,
                   lambda: build_model(config, torch.bfloat16, device).eval())
    if engine is None:
        return
    rec["sync"] = stage(f"{name}/sync", budget, RESERVE_S["sync"] * scale, lambda: time_sync(policy, engine, device))
    decode = [stage(f"{name}/decode_b{b}", budget, RESERVE_S["decode"] * scale,
                    lambda b=b: time_decode(engine, tok, shape, b, args.decode_tokens, peaks["hbm_read_gb_per_s"],
                                            device))
              for b in args.decode_batches]
    rec["decode"] = [d for d in decode if d is not None]
    step_share(rec, args)


def step_share(rec: dict, args) -> None:
    """The sync's share of a step: sync / (sync + generation + update phase), generation estimated from
    the decode row at the step's batch (or the nearest one) times ``--length`` steps."""
    if not rec.get("sync") or not rec.get("decode") or not rec.get("grpo"):
        return
    batch = args.prompts * args.group
    row = min(rec["decode"], key=lambda d: abs(d["batch"] - batch))
    generation = row["ms_per_step"] / 1e3 * args.length
    sync, phase = rec["sync"]["median_s"], rec["grpo"]["phase_s_median"]
    rec["sync"].update(share_of_step=sync / (sync + generation + phase),
                       step_estimate_s={"sync": sync, "generation": generation, "update_phase": phase,
                                        "generation_from_decode_batch": row["batch"]})


def free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def write_report(args) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check_scale.json"
    path.write_text(json.dumps(REPORT, indent=2, default=str))
    return path


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    from gpu_check_args import check_parser

    ap = check_parser(__doc__, "the same stages on the CPU at two tiny sizes (gloo; no memory or rate verdicts)")
    ap.add_argument("--configs", type=Path, default=None, help="folder of <size>/config.json (--export-configs)")
    ap.add_argument("--export-configs", type=Path, default=None, metavar="DIR",
                    help="only write the real sizes' config.json files to DIR and exit")
    ap.add_argument("--sizes", default=None, help=f"comma-separated subset of {list(SIZES)} (dry run: {list(DRY_SIZES)})")
    ap.add_argument("--tokenizer-dir", type=Path, default=None, help="a saved tokenizer (the tiny model's carry)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--length", type=int, default=1024, help="response tokens of the update's batch")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per fit (after 1 warm-up)")
    ap.add_argument("--decode-batches", default="16,64")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="seconds from the start of main (gpu_check.sh's part: 210 s, imports included)")
    args = ap.parse_args(argv)
    table = DRY_SIZES if args.dry_run else SIZES
    args.sizes = [s for s in (args.sizes or ",".join(table)).split(",") if s]
    unknown = sorted(set(args.sizes) - set(table))
    if unknown:
        ap.error(f"--sizes: unknown {unknown}; choose from {list(table)}")
    try:
        args.decode_batches = [int(b) for b in str(args.decode_batches).split(",") if b]
    except ValueError:
        ap.error(f"--decode-batches {args.decode_batches!r}: comma-separated integers, e.g. 16,64")
    for key in ("prompts", "group", "length", "micro", "steps", "decode_tokens", "gemm"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.group < 2 or (args.prompts * args.group) % args.micro:
        ap.error("--group must be >= 2 and --micro must divide --prompts x --group")
    if args.dry_run:  # tiny sizes, short runs: the plumbing and the output's fields only
        args.length, args.steps, args.decode_tokens, args.gemm = min(args.length, 8), min(args.steps, 1), 4, 256
        args.prompts, args.group, args.micro, args.decode_batches = 2, 2, 2, [2]
    return args


def tokenizer(args):
    if args.tokenizer_dir is not None and (args.tokenizer_dir / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(args.tokenizer_dir))
        tok.padding_side = "left"
        return tok
    from arlopti.models.loading import build_tiny_tokenizer

    return build_tiny_tokenizer()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.export_configs is not None:
        for path in export_configs(args.export_configs):
            print(f"wrote {path} ({path.stat().st_size} bytes)")
        return 0
    import torch

    budget = Budget(args.budget_s)
    device = "cpu" if args.dry_run else "cuda"
    REPORT.update(dry_run=args.dry_run, torch=torch.__version__, budget_s=args.budget_s, args=vars(args),
                  device=torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        REPORT["stages"]["cuda"] = {"status": "FAIL", "error": "torch.cuda.is_available() is False (use --dry-run)"}
        return finish(args, budget)
    if device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    peaks = stage("peaks", budget, 0.0, lambda: {"bf16_gemm_tflops": gemm_tflops(args.gemm, device),
                                                   "gemm_n": args.gemm,
                                                   "hbm_read_gb_per_s": read_gb_per_s(2.0 if device == "cuda" else 0.0625,
                                                                                      device)})
    REPORT["peaks"] = peaks
    if args.configs is not None:
        REPORT["configs"] = stage("configs", budget, 0.0, lambda: check_configs(args.configs))
    elif not args.dry_run:
        REPORT["configs"] = "not carried: built from the shapes in benchmarks/memory_plan.py and this file"
        print(f"NOTE configs: {REPORT['configs']} (bash benchmarks/gpu_check.sh --prepare writes them)", flush=True)
    print(f"peaks: {peaks}", flush=True)
    if peaks is not None:
        tok = tokenizer(args)
        for name in args.sizes:
            run_size(args, name, (DRY_SIZES if args.dry_run else SIZES)[name], tok, device, budget, peaks)
            print_size(name)
    return finish(args, budget)


def print_size(name: str) -> None:
    rec = REPORT["sizes"].get(name, {})
    g, lo, mem, sync = rec.get("grpo") or {}, rec.get("lopti_over_grpo") or {}, rec.get("memory") or {}, rec.get("sync") or {}
    fmt = lambda v, f="{:.3g}": "-" if v is None else f.format(v)  # noqa: E731
    print(f"{name}: update {fmt(g.get('update_s_median'))} s, MFU {fmt(g.get('mfu'))} (HFU {fmt(g.get('hfu'))}), "
          f"Lopti/GRPO update {fmt(lo.get('update'))}, phase {fmt(lo.get('update_phase'))}; peak "
          f"{fmt(mem.get('peak_allocated_gb'))} GB vs plan {fmt(mem.get('predicted_gb'))} GB; sync "
          f"{fmt(sync.get('median_s'))} s = {fmt(sync.get('share_of_step'))} of a step", flush=True)
    for d in rec.get("decode") or []:
        print(f"  decode batch {d['batch']}: {d['ms_per_step']:.2f} ms/step, {d['tok_per_s']:.0f} tok/s, "
              f"{d['of_limit']:.3f} of the HBM limit ({d['limit_ms_per_step']:.3f} ms)", flush=True)


def finish(args, budget: Budget) -> int:
    for name, st in REPORT["stages"].items():
        if st["status"] != "SKIP":
            print(f"{st['status']} {name}: {st.get('seconds', 0)} s" + (f" ({st['error']})" if "error" in st else ""))
    ran = [s for s in REPORT["stages"].values() if s["status"] != "SKIP"]
    REPORT["ok"] = bool(ran) and all(s["status"] == "PASS" for s in ran)
    REPORT["wall_s"] = round(budget.seconds - budget.left(), 1)
    path = write_report(args)
    print(f"wrote {path} ({REPORT['wall_s']} s)")
    print(f"GPU CHECK SCALE: {'PASS' if REPORT['ok'] else 'FAIL'}", flush=True)
    return 0 if REPORT["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
