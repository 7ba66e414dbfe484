"""One GRPO step, ours against TRL 1.16's ``GRPOTrainer``, on the same tiny Qwen2 model and settings.

Setup (both sides): a random Qwen2 (``--hidden`` × ``--layers``, the tiny BPE tokenizer) built
offline and saved to a temp dir; each side loads it from there. 2 prompts × 4 generations,
completions of exactly 64 tokens (``min_new_tokens = max_new_tokens = 64``), temperature 1,
AdamW lr 1e-6, weight decay 0, constant lr, grad-norm clip 1.0, PPO clip ε = 0.2 on both sides
(ours: ``clip_low = clip_high = 0.2``, no dual clip), β = 0.04 with the k3 estimator
(ours ``low_var_kl``), token-mean over the batch (ours ``token-mean`` / TRL ``dapo`` or
``bnpo``), group-std advantages with eps 1e-4, one forward/backward of all 8 sequences (ours
``micro_batch_size = 8``; TRL ``per_device_train_batch_size = 8``), fp32 on CPU
(TRL ``use_cpu=True, bf16=False, use_vllm=False, gradient_checkpointing=False``).

A *step* is one rollout and its update: generation with HF ``generate`` (KV cache), reference
log-probs, the training forward/backward and the optimizer step. GRPO: ours 1 optimizer step
vs TRL ``num_iterations=1`` (1 step; TRL then takes π_old from the training forward, as ours
does). Lopti: ours 2 optimizer steps (low phase, high phase) vs TRL ``num_iterations=2`` (2
optimizer steps on one rollout, with a separate π_old pass), timed as the two TRL steps.

Each configuration runs in its own fresh process (``_common.run_isolated``): 1 untimed warm-up
step, then ``--steps`` timed steps (wall time from the start of the rollout to the end of the
optimizer step, measured by a callback). Processes of the configurations alternate
(ours, TRL, ours, TRL, ...) ``--rounds`` times; the reported time is the median over all timed
steps. Peak RSS is the process's ``ru_maxrss`` at the end (the absolute high-water mark, imports
included: what the user sees), and also the growth over the baseline taken after imports.

Loss check (``--check-loss``): on identical fixed rollouts (varied lengths, fixed rewards), the
first-step loss and pre-clip gradient norm of ours and of TRL's ``_compute_loss`` on the same
weights.

The SmolLM2 size (``--model smollm2-135m-instruct --completion-len 256``): SmolLM2-135M-Instruct
loaded in fp32 by both sides, the same 2 prompts × 4, completions of exactly 256 tokens.
``--compare-decoder`` adds ours with ``rollout.hf_decoder=generate`` (transformers' ``generate``
instead of our decoding loop), the before/after of the loop within one run.

Usage:
  python benchmarks/bench_step.py --quick     # 1 round x 2 timed steps per side, ~1.5 min on 2 cores
  python benchmarks/bench_step.py             # 3 rounds x 3 timed steps per side
  python benchmarks/bench_step.py --model smollm2-135m-instruct --completion-len 256 --no-lopti --rounds 3 --steps 2
  python benchmarks/bench_step.py --smoke --sides ours   # the smallest size, measuring nothing (the CI test)
Output: a table on stdout and ``benchmarks/out/bench_step.json`` (``--out``: a name there, or a path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import format_table, max_rss_bytes, run_isolated, write_json

COMPLETION_LEN = 64
PROMPTS, GENERATIONS = 2, 4
LR, CLIP, BETA, ADV_EPS = 1e-6, 0.2, 0.04, 1e-4
MB = 2**20

PROMPT_TEXTS = [f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?" for i in range(64)]


def reward_of(text: str) -> float:
    """Both sides' reward: distinct characters mod 4 (varied within a group)."""
    return float(len(set(text)) % 4)


def build_model_dir(out: str, hidden: int, layers: int, inter: int) -> dict:
    """Save a random tiny Qwen2 and its tokenizer to ``out`` (runs in a child: no RSS pollution)."""
    from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, TinySpec(arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=4,
                                           num_kv_heads=2, intermediate_size=inter, tie_word_embeddings=True))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tok)}


# ------------------------------------------------------------------------------------- ours

def _our_cfg(model_dir: str, lopti: bool, micro_batch_size: int = PROMPTS * GENERATIONS,
             completion_len: int = COMPLETION_LEN, decoder: str = "loop"):
    from arlopti.config import (AlgorithmConfig, LoptiConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)

    n = PROMPTS * GENERATIONS
    return RunConfig(
        algorithm=AlgorithmConfig(clip_low=CLIP, clip_high=CLIP, dual_clip=None, kl_coef=BETA, adv_eps=ADV_EPS,
                                  kl_estimator="low_var_kl", loss_agg="token-mean",
                                  lopti=LoptiConfig(enabled=lopti, eta=0.002)),
        optim=OptimConfig(name="adamw", lr=LR, weight_decay=0.0, grad_clip=1.0),
        sizes=SizesConfig(prompts_per_step=PROMPTS, group_size=GENERATIONS, mini_batch_size=n,
                          micro_batch_size=micro_batch_size, logprob_micro_batch_size=n),
        model=ModelConfig(name_or_path=model_dir, logprob_impl="fused"),
        rollout=RolloutConfig(temperature=1.0, max_new_tokens=completion_len, generation_batch_size=n,
                              hf_decoder=decoder))


def _our_datamodule(tok, n_steps: int):
    from arlopti.data.prompt_datamodule import PromptDataModule, PromptRecord
    from arlopti.tasks.base import RewardResult, Task, _TASKS, register_task

    class BenchTask(Task):
        name = "bench_step"

        def score(self, responses, ground_truths, metas):
            return [RewardResult(reward_of(r), False, {}) for r in responses]

    if "bench_step" not in _TASKS:
        register_task("bench_step")(BenchTask)

    class DM(PromptDataModule):
        task_name = "bench_step"

        def train_records(self):
            return [PromptRecord(uid=f"b/{i}", ground_truth=None, task="bench_step", text=PROMPT_TEXTS[i])
                    for i in range(PROMPTS * n_steps)]

    return DM(tokenizer=tok, prompts_per_step=PROMPTS, max_prompt_length=256, shuffle=False)


def _profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU])


def _profile_tables(prof, rows: int = 15) -> dict:
    """Top ops of a finished profile: by self CPU time, and by total CPU time (nested ops included)."""
    ka = prof.key_averages()
    return {"self": ka.table(sort_by="self_cpu_time_total", row_limit=rows),
            "total": ka.table(sort_by="cpu_time_total", row_limit=rows)}


def run_ours(model_dir: str, lopti: bool, steps: int, profile: bool = False, completion_len: int = COMPLETION_LEN,
             decoder: str = "loop") -> dict:
    """Child: warm-up + ``steps`` timed rollout steps of our learner (fresh process).

    ``profile``: the second step (the first after the warm-up) runs under ``torch.profiler``
    (its time is then not counted)."""
    warnings.filterwarnings("ignore")
    import lightning.pytorch as L
    import torch  # noqa: F401

    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import load_tokenizer
    from arlopti.callbacks.rollout import RolloutCallback

    base = max_rss_bytes()
    tok = load_tokenizer(model_dir)
    module = GRPOModule(_our_cfg(model_dir, lopti, completion_len=completion_len, decoder=decoder), tokenizer=tok,
                        total_rollout_steps=steps + 1)
    module.policy.hf.generation_config.min_new_tokens = completion_len
    times: list[float] = []

    prof = _profiler() if profile else None

    class Timer(L.Callback):  # first in the list: starts before the rollout callback
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if prof is not None and batch_idx == 1:
                prof.start()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times.append(time.perf_counter() - self.t0)
            if prof is not None and batch_idx == 1:
                prof.stop()

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, precision="32-true",
                        callbacks=[Timer(), RolloutCallback(group_size=GENERATIONS)])
    trainer.fit(module, datamodule=_our_datamodule(tok, steps + 1))
    m = module.last_step_context.metrics
    lengths = module.last_step_context.experience.response_mask.sum(-1).tolist()
    if prof is not None:
        return {"profile": _profile_tables(prof), "step_s": times}
    return {"step_s": times[1:], "warmup_s": times[0], "peak_rss": max_rss_bytes(), "base_rss": base,
            "optimizer_steps": int(trainer.global_step), "completion_lengths": sorted(set(int(x) for x in lengths)),
            "timing": {k: v for k, v in m.items() if k.startswith("timing/")}}


# -------------------------------------------------------------------------------------- TRL

def _trl_trainer(model_dir: str, num_iterations: int, max_steps: int, loss_type: str, out_dir: str,
                 completion_len: int = COMPLETION_LEN):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=PROMPTS * GENERATIONS, gradient_accumulation_steps=1,
        num_generations=GENERATIONS, max_completion_length=completion_len,
        generation_kwargs={"min_new_tokens": completion_len}, temperature=1.0, top_p=1.0,
        learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        beta=BETA, epsilon=CLIP, loss_type=loss_type, num_iterations=num_iterations, scale_rewards="group",
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        max_steps=max_steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, seed=0, shuffle_dataset=False)

    def reward(completions, **kw):
        return [reward_of(c) for c in completions]

    ds = Dataset.from_list([{"prompt": t} for t in PROMPT_TEXTS[:PROMPTS * max_steps]])
    return GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)


def run_trl(model_dir: str, num_iterations: int, steps: int, loss_type: str = "dapo", profile: bool = False,
            completion_len: int = COMPLETION_LEN) -> dict:
    """Child: warm-up + ``steps`` timed rollout steps of TRL (each = ``num_iterations`` TRL steps).

    ``profile``: the second rollout step (TRL steps ``num_iterations`` .. ``2·num_iterations − 1``)
    runs under ``torch.profiler``."""
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401
    import trl  # noqa: F401
    from transformers import TrainerCallback

    base = max_rss_bytes()
    per: list[float] = []

    prof = _profiler() if profile else None

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if prof is not None and len(per) == num_iterations:
                prof.start()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            per.append(time.perf_counter() - self.t0)
            if prof is not None and len(per) == 2 * num_iterations:
                prof.stop()

    with tempfile.TemporaryDirectory() as out:
        trainer = _trl_trainer(model_dir, num_iterations, (steps + 1) * num_iterations, loss_type, out,
                               completion_len)
        trainer.add_callback(Timer())
        trainer.train()
        steps_done = trainer.state.global_step
    # one rollout step = num_iterations consecutive TRL steps (the first generates)
    rollout = [sum(per[i:i + num_iterations]) for i in range(0, len(per), num_iterations)]
    if prof is not None:
        return {"profile": _profile_tables(prof), "step_s": rollout}
    return {"step_s": rollout[1:], "warmup_s": rollout[0], "peak_rss": max_rss_bytes(), "base_rss": base,
            "optimizer_steps": int(steps_done), "trl_step_s": per}


# ------------------------------------------------------------------------------- loss check

def _fixed_rollout(tok, seed: int = 0):
    """2 prompts × 4 completions of varied lengths (random non-special tokens), fixed rewards."""
    import random

    rng = random.Random(seed)
    specials = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in specials]
    prompts = [tok(PROMPT_TEXTS[i])["input_ids"] for i in range(PROMPTS)]
    comps = [[[rng.choice(vocab) for _ in range(rng.randint(8, COMPLETION_LEN))] for _ in range(GENERATIONS)]
             for _ in range(PROMPTS)]
    rewards = [0.0, 1.0, 3.0, 1.0, 2.0, 0.0, 0.0, 1.0]
    return prompts, comps, rewards


def _metric(metrics: dict, name: str) -> float:
    """``update/<name>`` (``update/all/<name>`` in older versions of the learner's metric names)."""
    for key in (f"update/{name}", f"update/all/{name}"):
        if key in metrics:
            return float(metrics[key])
    raise KeyError(f"update/{name} not among the step metrics: {sorted(metrics)[:20]} ...")


def check_loss(model_dir: str) -> dict:
    """Child: first-step loss and pre-clip grad norm, ours vs TRL ``_compute_loss``, same rollout and weights."""
    warnings.filterwarnings("ignore")
    import lightning.pytorch as L
    import torch

    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import load_tokenizer
    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.rollout.engine import Completion, RolloutEngine

    tok = load_tokenizer(model_dir)
    prompts, comps, rewards = _fixed_rollout(tok)
    by_text = {}

    class Fixed(RolloutEngine):
        def generate(self, prompt_ids, n, sampling):
            assert [list(p) for p in prompt_ids] == prompts, "prompt tokenisation differs"
            out = []
            for i, cs in enumerate(comps):
                row = []
                for j, ids in enumerate(cs):
                    text = tok.decode(ids, skip_special_tokens=True)
                    by_text[text] = rewards[i * GENERATIONS + j]
                    row.append(Completion(ids, text, "length"))
                out.append(row)
            return out

    results = {}
    for mbs in (8, 4):  # one micro-batch like TRL, and two (the split must not change the loss)
        module = GRPOModule(_our_cfg(model_dir, lopti=False, micro_batch_size=mbs),
                            tokenizer=tok, total_rollout_steps=1)
        module.rollout_engine = Fixed()
        import arlopti.tasks.base as tb

        dm = _our_datamodule(tok, 1)
        task_cls = tb._TASKS["bench_step"]
        orig = task_cls.score
        task_cls.score = lambda self, responses, gts, metas: [tb.RewardResult(by_text[r], False, {})
                                                              for r in responses]
        try:
            L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[RolloutCallback(group_size=GENERATIONS)]).fit(module, datamodule=dm)
        finally:
            task_cls.score = orig
        m = module.last_step_context.metrics
        results[f"ours_mb{mbs}"] = {"loss": _metric(m, "loss"), "grad_norm": _metric(m, "grad_norm")}
        ours_adv = module.last_step_context.advantages[:, 0].tolist()

    # TRL: its _compute_loss on the same batch (advantages by TRL's formula, ref = same weights)
    with tempfile.TemporaryDirectory() as out:
        trainer = _trl_trainer(model_dir, 1, 1, "dapo", out)
        trainer.current_gradient_accumulation_steps = 1  # set by train() in TRL; one accumulation window
        trl_res = {}
        for loss_type in ("dapo", "bnpo"):
            trainer.loss_type = loss_type
            p_len = max(len(p) for p in prompts)
            flat = [(i, c) for i, cs in enumerate(comps) for c in cs]
            c_len = max(len(c) for _, c in flat)
            pad = tok.pad_token_id
            prompt_ids = torch.full((len(flat), p_len), pad)
            prompt_mask = torch.zeros_like(prompt_ids)
            comp_ids = torch.full((len(flat), c_len), pad)
            comp_mask = torch.zeros_like(comp_ids)
            for r, (i, c) in enumerate(flat):
                prompt_ids[r, p_len - len(prompts[i]):] = torch.tensor(prompts[i])
                prompt_mask[r, p_len - len(prompts[i]):] = 1
                comp_ids[r, :len(c)] = torch.tensor(c)
                comp_mask[r, :len(c)] = 1
            rw = torch.tensor(rewards).view(-1, GENERATIONS)
            adv = ((rw - rw.mean(1, keepdim=True)) / (rw.std(1, keepdim=True) + 1e-4)).view(-1)
            model = trainer.model
            model.train()
            with torch.no_grad():
                ref, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, torch.cat([prompt_ids, comp_ids], 1), torch.cat([prompt_mask, comp_mask], 1),
                    c_len)
            inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp_ids,
                      "completion_mask": comp_mask, "advantages": adv, "old_per_token_logps": None,
                      "ref_per_token_logps": ref, "num_items_in_batch": comp_mask.sum()}
            model.zero_grad(set_to_none=True)
            loss = trainer._compute_loss(model, inputs)
            loss.backward()
            gn = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()
                                                       if p.grad is not None]))
            trl_res[f"trl_{loss_type}"] = {"loss": float(loss.detach()), "grad_norm": float(gn)}
            trl_adv = adv.tolist()
    results.update(trl_res)
    results["advantage_max_abs_diff"] = max(abs(a - b) for a, b in zip(ours_adv, trl_adv))
    return results


# ------------------------------------------------------------------------------------- main

def _prepare_model(args, tmp: str) -> tuple[str, dict]:
    """The model directory both sides load, and what to print about it."""
    if args.model == "tiny":
        info = run_isolated(Path(__file__).resolve(), "build_model_dir",
                            {"out": tmp, "hidden": args.hidden, "layers": args.layers, "inter": 2 * args.hidden})
        return tmp, {**info, "model": f"tiny Qwen2, hidden {args.hidden}, {args.layers} layers"}
    from arlopti.models.loading import resolve_model_path

    # the converted bf16 safetensors: both sides load it in fp32 (ours ModelConfig.dtype, TRL's default)
    return resolve_model_path(args.model), {"model": args.model}


def _configs(args) -> dict[str, tuple[str, dict]]:
    """Configuration name -> (child function, its keyword arguments)."""
    ours, trl = run_ours.__name__, run_trl.__name__
    configs = {"ours_grpo": (ours, {"lopti": False}), "trl_grpo": (trl, {"num_iterations": 1})}
    if args.compare_decoder:  # the same learner with transformers' generate() as its decoder
        configs["ours_grpo_generate"] = (ours, {"lopti": False, "decoder": "generate"})
    if not args.no_lopti:
        configs["ours_lopti"] = (ours, {"lopti": True})
        configs["trl_iter2"] = (trl, {"num_iterations": 2})
    return {k: v for k, v in configs.items() if k.split("_")[0] in args.sides}


def _profile(args, model_dir: str, info: dict) -> None:
    here, profs = Path(__file__).resolve(), {}
    for name, (func, kw) in list(_configs(args).items())[:2]:
        out = run_isolated(here, func, {"model_dir": model_dir, "steps": 1, "profile": True,
                                        "completion_len": args.completion_len, **kw}, timeout_s=3600)
        profs[name] = out
        print(f"=== {name}: profiled step {out['step_s'][1]:.3f} s (warm-up {out['step_s'][0]:.3f} s) ===")
        print("top ops by self CPU time:\n" + out["profile"]["self"])
        print("top ops by total CPU time:\n" + out["profile"]["total"], flush=True)
    print(f"wrote {write_json(args.out or 'bench_step_profile.json', {'model': vars(args) | info, 'profiles': profs})}")


def _timed_runs(args, model_dir: str, rounds: int, steps: int) -> dict[str, list[dict]]:
    """Each configuration in a fresh process per round, the order rotated every round."""
    here, configs = Path(__file__).resolve(), _configs(args)
    res: dict[str, list[dict]] = {k: [] for k in configs}
    names = list(configs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            func, kw = configs[name]
            out = run_isolated(here, func, {"model_dir": model_dir, "steps": steps,
                                            "completion_len": args.completion_len, **kw}, timeout_s=3600)
            res[name].append(out)
            print(f"  round {r + 1} {name}: steps {[round(x, 2) for x in out['step_s']]} s, "
                  f"peak RSS {out['peak_rss'] / MB:.0f} MiB", flush=True)
    return res


def _summarise(res: dict[str, list[dict]]) -> tuple[dict, dict]:
    summary = {}
    for name, outs in res.items():
        times = [t for o in outs for t in o["step_s"]]
        summary[name] = {"median_step_s": statistics.median(times), "n": len(times),
                         "peak_rss_mib": max(o["peak_rss"] for o in outs) / MB,
                         "peak_rss_delta_mib": max(o["peak_rss"] - o["base_rss"] for o in outs) / MB,
                         "optimizer_steps": outs[0]["optimizer_steps"]}
        if "timing" in outs[0]:  # our learner's own timers, median over processes
            summary[name]["timing"] = {k: statistics.median(o["timing"][k] for o in outs) for k in outs[0]["timing"]}
    time_of = {k: v["median_step_s"] for k, v in summary.items()}
    ratios = {}
    if "trl_grpo" in time_of:
        ratios = {"grpo_time_ours_over_trl": time_of["ours_grpo"] / time_of["trl_grpo"],
                  "grpo_peak_rss_ours_over_trl": (summary["ours_grpo"]["peak_rss_mib"]
                                                  / summary["trl_grpo"]["peak_rss_mib"]),
                  "grpo_peak_rss_delta_ours_over_trl": (summary["ours_grpo"]["peak_rss_delta_mib"]
                                                        / summary["trl_grpo"]["peak_rss_delta_mib"])}
    if "ours_grpo_generate" in time_of:
        ratios["grpo_time_loop_over_generate_decoder"] = time_of["ours_grpo"] / time_of["ours_grpo_generate"]
    if "ours_lopti" in time_of and "trl_iter2" in time_of:
        ratios["lopti_time_ours_over_trl_iter2"] = time_of["ours_lopti"] / time_of["trl_iter2"]
        ratios["lopti_peak_rss_ours_over_trl_iter2"] = (summary["ours_lopti"]["peak_rss_mib"]
                                                        / summary["trl_iter2"]["peak_rss_mib"])
    return summary, ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round x 2 timed steps per configuration")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per process")
    ap.add_argument("--model", default="tiny", help="tiny (built, --hidden/--layers) or smollm2-135m-instruct")
    ap.add_argument("--completion-len", type=int, default=COMPLETION_LEN, help="tokens per completion (exactly)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-lopti", action="store_true")
    ap.add_argument("--compare-decoder", action="store_true",
                    help="also run ours with rollout.hf_decoder=generate (transformers' generate)")
    ap.add_argument("--check-loss", action="store_true", help="also compare the first-step loss with TRL's")
    ap.add_argument("--profile", action="store_true",
                    help="only profile one GRPO step of each side (torch.profiler, after 1 warm-up step); "
                         "print the top ops and write benchmarks/out/bench_step_profile.json")
    ap.add_argument("--sides", default="ours,trl", help="ours, trl or both (TRL: the bench extra)")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest size (tiny model 32 x 2, 4-token completions, 1 round x 1 step): runs, measures nothing")
    ap.add_argument("--out", default=None, help="JSON file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if not args.sides or set(args.sides) - {"ours", "trl"}:
        ap.error(f"--sides {','.join(args.sides)!r}: use ours, trl or ours,trl")
    if args.smoke:
        args.model, args.hidden, args.layers, args.completion_len, args.rounds, args.steps = "tiny", 32, 2, 4, 1, 1
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (2 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, info = _prepare_model(args, tmp)
        size = f": {info['params']:,} parameters, vocab {info['vocab']}" if "params" in info else ""
        print(info["model"] + size, flush=True)
        if args.profile:
            _profile(args, model_dir, info)
            return 0
        res = _timed_runs(args, model_dir, rounds, steps)
        loss = (run_isolated(Path(__file__).resolve(), "check_loss", {"model_dir": model_dir}, timeout_s=900)
                if args.check_loss and args.model == "tiny" and "trl" in args.sides else None)
    summary, ratios = _summarise(res)
    print(format_table([{"config": k, **v} for k, v in summary.items()],
                       ["config", "median_step_s", "n", "peak_rss_mib", "peak_rss_delta_mib", "optimizer_steps"]))
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    for k, v in summary.items():
        if "timing" in v:
            print(f"{k} learner timers (s): " + ", ".join(f"{t.split('/')[-1]} {x:.3f}" for t, x in v["timing"].items()))
    if loss is not None:
        print("first-step loss check (same fixed rollout, same weights):")
        for k, v in loss.items():
            print(f"  {k}: {v}")
    path = write_json(args.out or "bench_step.json", {"summary": summary, "ratios": ratios, "loss_check": loss,
                                                      "model": vars(args) | info, "raw": res})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
