"""GPU check of FSDP2 (``trainer=fsdp``) on one CUDA device over NCCL; ``--dry-run``: CPU and gloo.

    PYTHONPATH=src python benchmarks/gpu_check_fsdp.py [--dry-run] [--out DIR] [--steps 3]

Runs from a bare checkout with the machine's own python (``benchmarks/gpu_check.sh`` sets
PYTHONPATH=src and puts the carried hydra-core / omegaconf / antlr4 wheels on the path: the run
config is built in Python, but ``import arlopti`` imports both). It uses a tiny random Qwen2
(4 layers, hidden 256; ``--dry-run``: 2 layers, hidden 64, shorter responses, so that 2 CPU cores
finish in minutes) on the learner tests' toy task (``tests/helpers/toy.py``: a reward that varies
within every group, so every step has a gradient; a random model scores 0 on every K&K puzzle,
which made the old version's updates zero), Lopti, HF-engine rollouts
(``rollout=hf``), one rank, and ``FSDP2Strategy(mixed_precision="bf16",
activation_checkpointing=True)``: bf16 compute, fp32 master weights, the GPU settings that the
CPU tests do not exercise. Deterministic kernels are asked for
(``torch.use_deterministic_algorithms(True, warn_only=True)``, ``CUBLAS_WORKSPACE_CONFIG``).
Checks, each printed as PASS / FAIL with numbers:

1. ``train``: ``--steps`` rollout steps; parameters are DTensors in fp32 (master weights), the
   loss and gradient norms are finite, some gradient norm is > 0, the parameters moved, a checkpoint
   folder was written.
2. ``resume``: a fresh module resumes from that folder and runs one more step; the step
   counters continue.
3. ``resume_exact``: an uninterrupted run of ``--steps + 1`` steps from scratch ends with the
   same weights as the resumed one, bit for bit (max abs difference printed).
4. ``export``: ``arlopti.checkpoints.export`` turns the folder into a HF model whose weights equal the
   FSDP2 policy's full weights exactly; the log-prob difference to the bf16 FSDP2 forward is
   printed (expected ~1e-2: bf16 compute against the fp32 export).

Timings (per step, tokens/s), peak GPU memory and versions are printed and written to
``<out>/gpu_check_fsdp.json``. Last line: ``GPU CHECK FSDP: PASS`` or ``FAIL``; exit 0 iff PASS.
Expected wall time on one H200: well under a minute after imports; the budget is 8 minutes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS: dict = {"checks": {}}
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers.toy: the toy task


def check(name: str, ok: bool, **info) -> bool:
    RESULTS["checks"][name] = {"ok": bool(ok), **info}
    print(f"{'PASS' if ok else 'FAIL'} {name}: " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    return ok


def run_config(steps: int, small: bool = False):
    from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig, TinyModelConfig)

    tiny = (TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
            if small else TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                                          intermediate_size=512))
    return RunConfig(
        algorithm=AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=0.002)),
        sizes=SizesConfig(prompts_per_step=4 if small else 8, group_size=4, mini_batch_size=8 if small else 16,
                          micro_batch_size=4 if small else 8, logprob_micro_batch_size=16),
        optim=OptimConfig(lr=1e-4),
        model=ModelConfig(tiny=tiny),
        rollout=RolloutConfig(temperature=1.0, max_new_tokens=16 if small else 48, generation_batch_size=32))


def fit(cfg, tok, steps: int, accelerator: str, ckpt_dir: Path, ckpt_path: str | None = None):
    import lightning.pytorch as L

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from helpers.toy import ToyDataModule
    from arlopti.learner.module import GRPOModule
    from arlopti.learner.sharding import FSDP2Strategy
    from arlopti.callbacks.rollout import RolloutCallback

    L.seed_everything(0, verbose=False)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    dm = ToyDataModule(n=64, tokenizer=tok, prompts_per_step=cfg.sizes.prompts_per_step, max_prompt_length=256)
    strategy = FSDP2Strategy(mixed_precision="bf16", activation_checkpointing=True)
    trainer = L.Trainer(accelerator=accelerator, devices=1, strategy=strategy, max_epochs=1, logger=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, precision="32-true",
                        callbacks=[RolloutCallback(group_size=cfg.sizes.group_size),
                                   RolloutCheckpoint(str(ckpt_dir), every_n_steps=1)])
    times: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, *a):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, *a):
            times.append(time.perf_counter() - self.t0)

    trainer.callbacks.append(Timer())
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, times


def main() -> int:
    from gpu_check_args import check_parser  # benchmarks/ is on sys.path when run as a script

    ap = check_parser(__doc__, "CPU + gloo instead of CUDA + NCCL")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before CUDA starts)
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    accelerator = "cpu" if args.dry_run else "gpu"
    RESULTS.update(torch=torch.__version__, cuda=torch.version.cuda, dry_run=args.dry_run)
    if not args.dry_run:
        if not torch.cuda.is_available():
            check("cuda", False, reason="torch.cuda.is_available() is False (use --dry-run on CPU)")
            return finish(out, t_start)
        RESULTS.update(device=torch.cuda.get_device_name(0), nccl=".".join(map(str, torch.cuda.nccl.version())))
    else:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    import lightning

    RESULTS["lightning"] = lightning.__version__
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), lightning {lightning.__version__}, "
          f"{RESULTS.get('device', 'CPU dry run')}", flush=True)

    from arlopti.checkpoints.export import export_checkpoint
    from arlopti.learner.policy import PolicyLM
    from arlopti.learner.sharding import full_state_dict
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    cfg = run_config(args.steps, small=args.dry_run)
    work = Path(tempfile.mkdtemp(prefix="arlopti-fsdp-check-"))
    ckpt_dir = work / "checkpoints"
    ok = True
    try:
        # 1. train
        if not args.dry_run:
            torch.cuda.reset_peak_memory_stats()
        module, times = fit(cfg, tok, args.steps, accelerator, ckpt_dir)
        from torch.distributed.tensor import DTensor

        params = list(module.policy.parameters())
        m = module.last_step_context.metrics
        losses = [v for k, v in m.items() if k.endswith("/loss")]
        norms = [v for k, v in m.items() if k.endswith("/grad_norm")]
        full = full_state_dict(module.policy)
        from arlopti.models.loading import build_tiny_model

        init = build_tiny_model(tok, cfg.model.tiny)
        moved = max(float((full[f"hf.{k}"].float() - v.float()).abs().max()) for k, v in init.state_dict().items())
        tokens = m.get("rollout/tokens", 0.0)
        ok &= check("train", all(isinstance(p, DTensor) for p in params)
                    and all(p.dtype == torch.float32 for p in params)
                    and bool(losses) and all(math.isfinite(x) for x in losses + norms) and moved > 0
                    and any(x > 0 for x in norms)
                    and (ckpt_dir / "last.ckpt" / "meta.pt").is_file(),
                    steps=module.rollout_step, optimizer_steps=module.trainer.global_step,
                    step_s=[round(x, 3) for x in times], tokens_per_step=tokens,
                    tokens_per_s=(round(tokens / (sum(times[1:]) / (len(times) - 1)), 1)  # the first step warms up
                                  if len(times) > 1 else None),
                    loss=[round(x, 5) for x in losses], grad_norm=[round(x, 5) for x in norms],
                    max_param_change=f"{moved:.3g}",
                    peak_mem_gib=None if args.dry_run else round(torch.cuda.max_memory_allocated() / 2**30, 3))

        # 2. resume
        resumed, rtimes = fit(cfg, tok, args.steps + 1, accelerator, ckpt_dir, ckpt_path=str(ckpt_dir / "last.ckpt"))
        ok &= check("resume", resumed.rollout_step == args.steps + 1
                    and resumed.trainer.global_step > module.trainer.global_step,
                    rollout_step=resumed.rollout_step, optimizer_steps=resumed.trainer.global_step,
                    step_s=[round(x, 3) for x in rtimes])
        straight, _ = fit(cfg, tok, args.steps + 1, accelerator, work / "straight")
        a, b = full_state_dict(resumed.policy), full_state_dict(straight.policy)
        diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        ok &= check("resume_exact", a.keys() == b.keys() and diff == 0.0, max_abs_diff_vs_uninterrupted=diff,
                    optimizer_steps=(resumed.trainer.global_step, straight.trainer.global_step))

        # 3. export (of the folder the resumed run wrote last) against the resumed FSDP2 policy
        exported = export_checkpoint(ckpt_dir / "last.ckpt", work / "hf")
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(exported)
        now = full_state_dict(resumed.policy)
        worst = max(float((now[f"hf.{k}"].float() - v.float()).abs().max()) for k, v in hf.state_dict().items())
        prompt = tok("Zoey said that Oliver is a knight.", add_special_tokens=False)["input_ids"]
        resp = tok(" So Emma is a knave.", add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + resp])
        device = resumed.device
        resumed.policy.eval()
        with torch.no_grad():
            lp_fsdp, _ = resumed.policy(ids.to(device), torch.ones_like(ids).to(device), len(prompt), 1.0, False)
            lp_hf, _ = PolicyLM(hf).eval()(ids, torch.ones_like(ids), len(prompt), 1.0, False)
        ok &= check("export", worst == 0.0, max_weight_diff=worst,
                    logp_diff_vs_bf16_forward=f"{float((lp_fsdp.float().cpu() - lp_hf).abs().max()):.3g}")
    except Exception as err:  # report, do not hide
        traceback.print_exc()
        ok = check("exception", False, error=f"{type(err).__name__}: {err}")
    RESULTS["ok"] = bool(ok)
    return finish(out, t_start)


def finish(out: Path, t_start: float) -> int:
    ok = bool(RESULTS.get("ok")) and all(c["ok"] for c in RESULTS["checks"].values())
    RESULTS["wall_s"] = round(time.perf_counter() - t_start, 1)
    (out / "gpu_check_fsdp.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    print(f"wrote {out / 'gpu_check_fsdp.json'} ({RESULTS['wall_s']} s)")
    print(f"GPU CHECK FSDP: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
