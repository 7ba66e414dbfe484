"""What fits on 1, 4 and 8 GPUs of 80 GB for the paper's 3B and 7B runs: a memory estimate from
the model shapes (no GPU needed). Prints the markdown table in docs/scaling.md.

    python benchmarks/memory_plan.py [--gpu-gb 80] [--vllm-util 0.6] [--micro 8] [--tokens 4496]

Per GPU, FSDP2 over N GPUs (trainer=fsdp_bf16), counted in bytes of P parameters:

* resident trainer state: fp32 master weights 4P + fp32 gradients 4P + AdamW moments 8P, all
  sharded (÷N), plus the frozen reference model in bf16, 2P ÷ N (model.ref_dtype=bfloat16);
* update transient: one decoder layer's bf16 parameters gathered in full (2·layer params, and as
  much again prefetched) and the activations of one micro-batch of ``micro`` responses of
  ``tokens`` tokens (prompt 400 + response 4096) with gradient checkpointing on: the bf16 input
  of every layer (2·h bytes per token per layer) plus one layer recomputed in full (~34·h bytes per
  token, Korthikanti et al. 2022, no s² term with SDPA/flash attention) plus one logits tile of the
  fused log-prob kernel (ignored: a few MB);
* rollout: vLLM reserves ``vllm_util`` × the GPU (weights in bf16 + KV cache) while it generates;
  with sleep mode (rollout.enable_sleep, on in the paper experiments) it frees that during the update.

Not counted: the CUDA context and allocator fragmentation (budget 2-4 GB), NCCL buffers. An
estimate to plan with, not a measurement.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def layer_params(self) -> int:
        head_dim = self.hidden // self.heads
        attn = self.hidden * self.hidden * 2 + self.hidden * self.kv_heads * head_dim * 2  # q, o; k, v
        attn += self.hidden + 2 * self.kv_heads * head_dim  # q/k/v biases (Qwen2)
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden  # two RMSNorms

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params + embed + self.hidden


# The published config.json shapes of the models the paper experiments use (configs/model/).
MODELS = (
    Shape("Qwen2.5-3B-Instruct", hidden=2048, layers=36, intermediate=11008, heads=16, kv_heads=2,
          vocab=151936, tied=True),
    Shape("Qwen2.5-7B / -7B-Instruct-1M", hidden=3584, layers=28, intermediate=18944, heads=28, kv_heads=4,
          vocab=152064, tied=False),
)


def plan(m: Shape, gpus: int, gpu_gb: float, vllm_util: float, micro: int, tokens: int) -> dict:
    p = m.params
    resident = (16 * p + 2 * p) / gpus
    gathered = 2 * 2 * m.layer_params
    acts = micro * tokens * m.hidden * (2 * m.layers + 34)
    update = resident + gathered + acts
    rollout = resident + vllm_util * gpu_gb * GB
    free_for_vllm = (gpu_gb * GB - resident) / (gpu_gb * GB)
    return {"params_b": p / 1e9, "resident": resident / GB, "update": update / GB, "rollout": rollout / GB,
            "max_util": free_for_vllm, "fits": update <= gpu_gb * GB and rollout <= gpu_gb * GB}


def table(gpu_gb: float, vllm_util: float, micro: int, tokens: int) -> str:
    head = (f"| model (params) | GPUs × {gpu_gb:.0f} GB | resident trainer state / GPU | update peak / GPU "
            f"| rollout peak / GPU (vLLM {vllm_util:.0%}) | largest gpu_memory_utilization | fits as configured |")
    rows = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in MODELS:
        for n in (1, 4, 8):
            r = plan(m, n, gpu_gb, vllm_util, micro, tokens)
            util = f"{r['max_util']:.2f}" if r["max_util"] > 0 else "none"
            rows.append(f"| {m.name} ({r['params_b']:.2f} B) | {n} | {r['resident']:.1f} GB | {r['update']:.1f} GB "
                        f"| {r['rollout']:.1f} GB | {util} | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-gb", type=float, default=80.0)
    ap.add_argument("--vllm-util", type=float, default=0.6, help="rollout.gpu_memory_utilization")
    ap.add_argument("--micro", type=int, default=8, help="responses per micro-batch per GPU")
    ap.add_argument("--tokens", type=int, default=4496, help="prompt + response tokens per response")
    a = ap.parse_args(argv)
    print(table(a.gpu_gb, a.vllm_util, a.micro, a.tokens))


if __name__ == "__main__":
    main()
