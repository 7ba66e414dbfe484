"""GPU check of the learner: the AR + Lopti update on CUDA against an fp64 CPU reference.

    PYTHONPATH=src python benchmarks/gpu_check_learner.py [--dry-run] [--out DIR] [--steps 2]

The same run three times, on fixed rollouts (``tests/helpers/fixed_rollouts.FixedEngine``: the
same completions whatever the weights) on the toy task, a tiny random Qwen2, AR (alpha 0.3) +
Lopti (eta 0.002, the tiny model's p_old sits near 1/vocab), ``--steps`` rollout steps:

* ``cuda``: fp32 on the GPU (``--dry-run``: fp32 on the CPU again, so only the plumbing is checked);
* ``fp64``: the reference, on the CPU with the policy and reference model in float64;
* ``cpu32``: fp32 on the CPU, the yardstick for what fp32 rounding alone gives.

Check ``update``: the CUDA weights' largest deviation from the fp64 ones is at most 10x the CPU
fp32 one's (plus 1e-7), and both moved the weights by far more than that (the update happened).
The per-step losses are printed side by side. TF32 is off (``allow_tf32`` printed). Last line:
``GPU CHECK LEARNER: PASS`` or ``FAIL``; exit 0 iff PASS; ``<out>/gpu_check_learner.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # helpers.toy / helpers.fixed_rollouts: the learner tests' pieces
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run(device: str, dtype, steps: int) -> tuple[dict, list[float]]:
    """One run; returns (final policy weights on the CPU in fp64, per-step losses)."""
    import lightning.pytorch as L

    from arlopti.config import AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import build_tiny_tokenizer
    from helpers.fixed_rollouts import FixedEngine
    from helpers.toy import ToyDataModule, toy_trainer

    L.seed_everything(0, verbose=False)
    tok = build_tiny_tokenizer()
    cfg = RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.002)),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-3), rollout=RolloutConfig(temperature=1.0, max_new_tokens=12))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.policy.to(dtype)
    if module.ref is not None:
        module.ref.to(dtype)
    module.rollout_engine = FixedEngine(tok, min_len=2)
    losses: list[float] = []

    class ExperienceDtype(L.Callback):  # the experience's float tensors (mask, rewards) in the run's dtype
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            import dataclasses

            import torch

            exp = batch.experience
            batch.experience = dataclasses.replace(exp, **{
                f.name: getattr(exp, f.name).to(dtype) for f in dataclasses.fields(exp)
                if isinstance(getattr(exp, f.name), torch.Tensor) and getattr(exp, f.name).is_floating_point()})

    class Losses(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *a):
            m = pl_module.last_step_context.metrics
            losses.append(sum(v for k, v in m.items() if k.endswith("/loss")))

    dm = ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=64)
    toy_trainer(callbacks=[ExperienceDtype(), Losses()], accelerator="gpu" if device == "cuda" else "cpu").fit(module, datamodule=dm)
    import torch

    return {k: v.detach().to("cpu", torch.float64) for k, v in module.policy.named_parameters()}, losses


def main() -> int:
    from gpu_check_args import check_parser  # benchmarks/ is on sys.path when run as a script

    ap = check_parser(__doc__, "the 'cuda' run on the CPU (plumbing only)")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    import torch

    t0 = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda"
    report: dict = {"dry_run": args.dry_run, "torch": torch.__version__,
                    "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
    if device == "cuda" and not torch.cuda.is_available():
        print("FAIL update: torch.cuda.is_available() is False (use --dry-run on CPU)")
        print("GPU CHECK LEARNER: FAIL")
        return 1
    init = {}
    from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer

    for k, v in build_tiny_model(build_tiny_tokenizer()).named_parameters():
        init[f"hf.{k}"] = v.detach().double()
    ref, loss64 = run("cpu", torch.float64, args.steps)
    cpu32, loss32 = run("cpu", torch.float32, args.steps)
    dev, lossdev = run(device, torch.float32, args.steps)

    def worst(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    moved = worst(ref, {k: init.get(k, v) for k, v in ref.items()})
    d_dev, d_cpu = worst(dev, ref), worst(cpu32, ref)
    ok = dev.keys() == ref.keys() and d_dev <= 10 * d_cpu + 1e-7 and moved > 10 * max(d_dev, d_cpu)
    report.update(max_abs_diff_vs_fp64={"device": d_dev, "cpu_fp32": d_cpu}, max_weight_change=moved,
                  losses={"fp64": loss64, "cpu_fp32": loss32, device: lossdev},
                  device_name=torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
                  ok=ok, wall_s=round(time.perf_counter() - t0, 1))
    print(f"{'PASS' if ok else 'FAIL'} update: AR+Lopti, {args.steps} rollout steps; max |w - w_fp64|: {device} "
          f"{d_dev:.3g}, cpu fp32 {d_cpu:.3g}; max weight change {moved:.3g}; losses fp64 {loss64} / "
          f"{device} {lossdev}; allow_tf32 {report['allow_tf32']}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check_learner.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"GPU CHECK LEARNER: {'PASS' if ok else 'FAIL'} ({report['wall_s']} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
