"""What fits on 1, 4 and 8 GPUs of "80 GB" for the paper's 3B and 7B runs: a per-GPU memory
estimate from the model shapes, term by term, each with its source (no GPU needed). Prints the
tables in docs/scaling.md.

    python benchmarks/memory_plan.py [--micro 8] [--tokens 4496] [--gpu-total-gb 85.52]
    python benchmarks/memory_plan.py --reward-model 7b [--reward-batch 16]   # with a task.reward_model

Setting: ``trainer=fsdp_bf16`` (FSDP2 over N GPUs, bf16 compute, fp32 master weights, gradient
reductions and AdamW state, gradient checkpointing), the frozen reference in bf16, a colocated
vLLM engine per GPU in bf16 that sleeps (level 2) during the update. P = parameters, V = vocab,
h = hidden, i = MLP width, Lp = one decoder layer's parameters, ``micro`` responses of ``tokens``
tokens per micro-batch per GPU. Every term is in :func:`terms`, with its source.

The three moments a GPU's memory peaks:

* **update** (vLLM asleep): the resident trainer state with gradients + the update's transients;
* **sync** (vLLM's weights awake, KV cache not yet: ``VLLMEngine.wake_and_sync``): the trainer
  state without gradients (``zero_grad(set_to_none=True)`` before the rollout) + vLLM's bf16
  weights + the sync's gathered tensors;
* **rollout**: the trainer state without gradients + vLLM's reservation,
  ``gpu_memory_utilization`` × the card's *total* memory (vLLM ``v1/worker/utils.py``
  ``request_memory``), which on an "80 GB" card is 85.5 GB, not 80.

A learned reward model (``task.reward_model``, ``arlopti/tasks/reward_model.py``; ``--reward-model``, its
shape one of :data:`MODELS`) adds to every peak its bf16 weights, whole on every rank (loaded once, kept),
and to the rollout peak its forward: the rollout callback scores before vLLM goes back to sleep, so the
forward's transients (:func:`reward_terms`) sit on top of vLLM's reservation.

A setting fits when the highest of the three leaves at least ``MARGIN_GB`` free for allocator
fragmentation (the CUDA context and NCCL buffers are counted as their own term). An estimate to
plan with, not a measurement: nothing here has run on a GPU.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

GB = 1e9
# An "80 GB" H100 / A100 reports 81,559 MiB total (torch.cuda.mem_get_info) = 85.52 GB; vLLM's
# gpu_memory_utilization is a share of that (../shared/notes/gpu_path_review.md, R2).
GPU_TOTAL_GB = 81559 * 2**20 / GB
CONTEXT_GB = 1.5  # CUDA context + NCCL communicator buffers per process (vLLM's engine shares the process)
MARGIN_GB = 4.0  # left free for allocator fragmentation: what "fits" requires
EXPERIMENTS = Path(__file__).resolve().parents[1] / "configs" / "experiment"


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
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        kv = self.kv_heads * self.head_dim
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * kv  # q, o; k, v
        attn += self.hidden + 2 * kv  # q/k/v biases (Qwen2)
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return attn + mlp + 2 * self.hidden  # two RMSNorms

    @property
    def root_params(self) -> int:
        """What FSDP2's root unit holds (sharding.py shards each layer, then the root): the
        embedding, the LM head unless tied, and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def largest_param(self) -> int:
        return self.vocab * self.hidden  # the embedding (and the untied head)


# The published config.json shapes of the models the paper experiments use (configs/model/).
MODELS = {
    "3b": Shape("Qwen2.5-3B-Instruct", hidden=2048, layers=36, intermediate=11008, heads=16, kv_heads=2,
                vocab=151936, tied=True),
    "7b": Shape("Qwen2.5-7B / -7B-Instruct-1M", hidden=3584, layers=28, intermediate=18944, heads=28, kv_heads=4,
                vocab=152064, tied=False),
}


def recompute_bytes_per_token(m: Shape) -> int:
    """bf16 activations autograd keeps while one checkpointed decoder layer is recomputed, per token.

    Attention: the q/k/v input 2h, q 2h, k and v 2·2·kv·head_dim, the SDPA output 2h (also the
    o_proj input). MLP (SwiGLU): its input 2h, gate 2i, up 2i, SiLU(gate) 2i, their product
    (the down_proj input) 2i. Each RMSNorm (transformers' Qwen2RMSNorm upcasts to fp32): the fp32
    input 4h and the bf16 normalised value 2h, twice. Sum: 20h + 4·kv·head_dim + 8i, the
    Korthikanti et al. (2022) count without dropout, with SwiGLU's width i instead of GeLU's 4h.
    """
    return 20 * m.hidden + 4 * m.kv_heads * m.head_dim + 8 * m.intermediate


def terms(m: Shape, gpus: int, micro: int, tokens: int, bucket_mb: int = 256) -> dict[str, float]:
    """Every term in bytes per GPU, named by what it is and where it comes from."""
    p, n, lp, root = m.params, gpus, m.layer_params, m.root_params
    return {
        # resident, sharded over the N ranks (FSDP2; learner/sharding.py)
        "master weights fp32 (4P/N)": 4 * p / n,
        "AdamW moments fp32 (8P/N)": 8 * p / n,
        "gradients fp32 (4P/N; freed before the rollout)": 4 * p / n,
        "reference model bf16 (2P/N; model.ref_dtype)": 2 * p / n,
        # update transients
        "root unsharded bf16: embedding, head, norm (2·root)": 2 * root,  # the root keeps them forward→backward
        "root gradients bf16 + fp32 for the reduce-scatter (6·root)": 6 * root,  # reduce_dtype=float32
        "fused log-prob head gradient fp32 (4·V·h; ops/logprobs.py _fused_backward)": 4 * m.largest_param,
        "two decoder layers gathered bf16 (current + prefetch, 4·Lp)": 4 * lp,
        "one layer's gradients bf16 + fp32 reduce-scatter (6·Lp)": 6 * lp,
        "checkpointed layer inputs bf16 (micro·T·layers·2h)": micro * tokens * m.layers * 2 * m.hidden,
        "one layer recomputed (micro·T·(20h + 4·kv·hd + 8i))": micro * tokens * recompute_bytes_per_token(m),
        # rollout
        "vLLM weights bf16 (2P)": 2 * p,
        "sync transient: largest tensor gathered fp32 + its bf16 copy (weight_sync.stream_tensors)":
            max(bucket_mb * 2**20, 4 * m.largest_param) + 2 * m.largest_param,
        "CUDA context + NCCL": CONTEXT_GB * GB,
    }


def reward_terms(rm: Shape, batch: int, tokens: int) -> dict[str, float]:
    """A sequence-classification reward model's terms in bytes per GPU (bf16, ``task.reward_model_batch_size``
    sequences of ``tokens`` per forward, under ``torch.inference_mode``). Its parameters are the causal LM's
    but the LM head: the score head is one row (h), so an untied model sheds V·h."""
    params = rm.layers * rm.layer_params + rm.vocab * rm.hidden + 2 * rm.hidden  # layers, embedding, norm, score
    return {
        "reward model weights bf16 (2·P_rm; task.reward_model, whole on every rank)": 2 * params,
        # inference_mode frees each layer's activations after it: one layer's live at a time, at most what
        # autograd keeps for a checkpointed layer's recompute (recompute_bytes_per_token)
        "reward model forward: one layer's activations bf16 (batch·T·(20h + 4·kv·hd + 8i))":
            batch * tokens * recompute_bytes_per_token(rm),
        "reward model forward: the padded batch's 4-D attention mask bf16 (batch·T²·2)": batch * tokens * tokens * 2,
    }


def plan(m: Shape, gpus: int, util: float, micro: int, tokens: int, total_gb: float = GPU_TOTAL_GB,
         reward_model: Shape | None = None, reward_batch: int = 16) -> dict:
    """The three peaks (GB), the largest ``gpu_memory_utilization`` that keeps ``MARGIN_GB`` free,
    and whether ``util`` fits; ``reward_model``: a ``task.reward_model`` of that shape (module docstring)."""
    t = {k: v / GB for k, v in terms(m, gpus, micro, tokens).items()}
    v = list(t.values())
    master, adam, grads, ref = v[0:4]
    update_transient = sum(v[4:11])
    vllm_weights, sync, context = v[11:14]
    rm_weights = rm_forward = 0.0
    if reward_model is not None:
        rm = {k: x / GB for k, x in reward_terms(reward_model, reward_batch, tokens).items()}
        t.update(rm)
        rm_weights, rm_forward = list(rm.values())[0], sum(list(rm.values())[1:])
    no_grads = master + adam + ref + rm_weights
    peaks = {"update": no_grads + grads + update_transient + context,
             "sync": no_grads + vllm_weights + sync + context,
             "rollout": no_grads + util * total_gb + context + rm_forward}
    worst = max(peaks.values())
    max_util = (total_gb - MARGIN_GB - no_grads - context - rm_forward) / total_gb
    return {"params_b": m.params / 1e9, "terms": t, "resident": no_grads + grads, "no_grads": no_grads, **peaks,
            "margin": total_gb - worst, "max_util": max_util, "fits": total_gb - worst >= MARGIN_GB}


def table(util: float, micro: int, tokens: int, total_gb: float = GPU_TOTAL_GB, reward_model: Shape | None = None,
          reward_batch: int = 16) -> str:
    rows = [f"| model (params) | GPUs | trainer state / GPU (w/o grads) | update peak | sync peak "
            f"| rollout peak (util {util}) | free at the peak | largest util (≥ {MARGIN_GB:g} GB free) | fits |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in MODELS.values():
        for n in (1, 4, 8):
            r = plan(m, n, util, micro, tokens, total_gb, reward_model, reward_batch)
            best = f"{r['max_util']:.2f}" if r["max_util"] > 0 else "none"
            rows.append(f"| {m.name} ({r['params_b']:.2f} B) | {n} | {r['resident']:.1f} ({r['no_grads']:.1f}) GB "
                        f"| {r['update']:.1f} GB | {r['sync']:.1f} GB | {r['rollout']:.1f} GB | {r['margin']:.1f} GB "
                        f"| {best} | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(rows)


def terms_table(m: Shape, gpus: int, micro: int, tokens: int) -> str:
    rows = [f"| term ({m.name}, {gpus} GPUs, micro {micro} × {tokens} tokens) | GB / GPU |", "| --- | --- |"]
    rows += [f"| {k} | {v / GB:.2f} |" for k, v in terms(m, gpus, micro, tokens).items()]
    return "\n".join(rows)


# ------------------------------------------------------------------ the paper experiments' settings
def _experiment_chain(name: str) -> list[dict]:
    """The experiment file and the experiment files it builds on (its plain ``defaults`` entries),
    nearest first, as ``{"text": ...}``: a tiny reader of our own files, not Hydra."""
    chain, cur = [], name
    while cur:
        text = (EXPERIMENTS / f"{cur}.yaml").read_text()
        chain.append({"name": cur, "text": text})
        base = re.findall(r"^\s+-\s+([A-Za-z0-9_]+)\s*$", text, flags=re.M)
        cur = base[0] if base else None
    return chain


def experiment_setting(name: str, key: str) -> str | None:
    """The value of ``rollout.<key>`` or ``override /<key>`` an experiment ends up with (None if unset)."""
    for f in _experiment_chain(name):
        if key.startswith("/"):
            hit = re.search(rf"^\s+-\s+override\s+{re.escape(key)}:\s*(\S+)", f["text"], flags=re.M)
        else:
            block = re.search(r"^rollout:\n((?:[ \t]+.*\n?)*)", f["text"], flags=re.M)
            hit = block and re.search(rf"^\s+{re.escape(key)}:\s*([^\s#]+)", block.group(1), flags=re.M)
        if hit:
            return hit.group(1)
    return None


def paper_experiments() -> dict[str, dict]:
    """Every experiment with ``rollout=vllm``: its model, gpu_memory_utilization and sleep level."""
    out = {}
    for path in sorted(EXPERIMENTS.glob("*.yaml")):
        name = path.stem
        if experiment_setting(name, "/rollout") != "vllm":
            continue
        model = experiment_setting(name, "/model") or ""
        out[name] = {"model": "7b" if "7b" in model else "3b",
                     "util": float(experiment_setting(name, "gpu_memory_utilization") or 0.3),
                     "sleep_level": int(experiment_setting(name, "sleep_level") or 1)}
    return out


def experiments_table(micro: int, tokens: int, gpus: tuple[int, ...] = (4, 8)) -> str:
    """Each paper experiment's default (and the README's 7B variant of the K&K ones) on 4 and 8 GPUs."""
    rows = ["| experiments | model | util | GPUs | highest peak | free at it | fits |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple, list[str]] = {}
    for name, e in paper_experiments().items():
        for model in sorted({e["model"], "7b"}):  # the K&K ones also run with model=qwen2.5-7b-instruct-1m
            groups.setdefault((model, e["util"]), []).append(name)
    for (model, util), names in sorted(groups.items()):
        for n in gpus:
            r = plan(MODELS[model], n, util, micro, tokens)
            label = ", ".join(names) if len(names) <= 3 else f"{len(names)} ({names[0]}, ...)"
            peak = max(("update", "sync", "rollout"), key=lambda k: r[k])
            rows.append(f"| {label} | {MODELS[model].name} | {util} | {n} | {r[peak]:.1f} GB ({peak}) "
                        f"| {r['margin']:.1f} GB | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro", type=int, default=8, help="responses per micro-batch per GPU (the experiments' 8)")
    ap.add_argument("--tokens", type=int, default=4496, help="prompt + response tokens per response (400 + 4096)")
    ap.add_argument("--gpu-total-gb", type=float, default=GPU_TOTAL_GB, help="the card's total memory in GB")
    ap.add_argument("--util", type=float, default=0.45, help="gpu_memory_utilization for the first table")
    ap.add_argument("--reward-model", choices=sorted(MODELS), default=None,
                    help="also plan with a task.reward_model of this shape (bf16, on every rank)")
    ap.add_argument("--reward-batch", type=int, default=16, help="task.reward_model_batch_size")
    a = ap.parse_args(argv)
    if a.reward_model:
        rm = MODELS[a.reward_model]
        print(f"With task.reward_model = a {rm.name}-shaped reward model, batch {a.reward_batch}:\n")
        print(table(a.util, a.micro, a.tokens, a.gpu_total_gb, rm, a.reward_batch))
        print()
        print("\n".join(f"| {k} | {v / GB:.2f} |" for k, v in reward_terms(rm, a.reward_batch, a.tokens).items()))
        return
    print(f"GPU total {a.gpu_total_gb:.2f} GB; fits = at least {MARGIN_GB:g} GB free at the highest peak\n")
    print(table(a.util, a.micro, a.tokens, a.gpu_total_gb))
    print()
    print(terms_table(MODELS["7b"], 4, a.micro, a.tokens))
    print()
    print(experiments_table(a.micro, a.tokens))


if __name__ == "__main__":
    main()
