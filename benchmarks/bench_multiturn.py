"""Multi-turn rollouts: tokens/s on HF and colocated vLLM, the environment's share, and the math-tool example.

    python benchmarks/bench_multiturn.py rollout [--engines hf,vllm] [--repeats 5] [--quick]
    python benchmarks/bench_multiturn.py train [--steps 4] [OVERRIDE ...]

Run both under the machine's lock (``flock /tmp/arlopti-cpu.lock ...``): a timing taken beside another job is
not a measurement.

``rollout``: SmolLM2-135M-Instruct (weights in bf16 where the CPU has native bf16, else fp32, as
``trainer.precision=auto`` picks), ``--prompts`` DSR-Uniform problems (the shared fixture, the chat template
with the math-tool instruction, :class:`arlopti.tasks.env.math_tool.MathToolEnv`), ``--n`` episodes each, up
to ``--turns`` model turns of ``--max-new-tokens`` tokens at T = 0.7, stopped at ```` ```output ````: the
environment runs the turn's code (a real subprocess) and replies. Each engine (:class:`arlopti.rollout.hf.HFEngine`,
:class:`arlopti.rollout.vllm.VLLMEngine` in this process, eager) runs, alternating, ``--repeats`` (>= 5) rounds of

* **multi-turn**: one turn-loop round (:mod:`arlopti.rollout.turns`; the same seeds every round, so the same
  episodes); tokens/s = sampled tokens (the trainable ones) / wall time, the environment's seconds included;
  also without them, and the environment's share of the round (``env_s`` / wall);
* **single-turn** (the reference, the same engine's rate on the same prompts in the same run): one call on
  the episodes' first prompts generating exactly ``--max-new-tokens`` tokens each (EOS suppressed);

and the median of the per-round ratios multi / single is reported, with the episodes' turns and tool calls.

``train``: ``python train.py experiment=math_tool rollout_steps=STEPS logger=csv`` in a subprocess (the math-tool
example on SmolLM2), then, per step from its ``metrics.csv``: the reward, the accuracy, turns (mean, max), tool
calls and errors, the environment's seconds and its share of the step time (``timing/env_s`` over the sum of the
step's ``timing/*_s``: rollout, scoring, log-probs, update; env_s is part of rollout_s). Both write JSON under
``benchmarks/out/`` (``_common.write_json``: the command line and the machine).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import OUT_DIR, REPO, format_table, interleaved_order, machine_info, write_json

FIXTURE = Path(os.environ.get("ARLOPTI_SHARED", REPO.parent / "shared")) / "fixtures/math/dsr_uniform_train_10k.jsonl.gz"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("rollout", help="multi-turn vs single-turn tokens/s per engine")
    r.add_argument("--engines", default="hf,vllm")
    r.add_argument("--prompts", type=int, default=4)
    r.add_argument("--n", type=int, default=4, help="episodes per prompt")
    r.add_argument("--turns", type=int, default=3)
    r.add_argument("--max-new-tokens", type=int, default=128, help="per model turn")
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--quick", action="store_true", help="2 prompts x n=2 x 64 tokens a turn")
    r.add_argument("--tiny", action="store_true", help="the tiny random model instead of SmolLM2 (a smoke run)")
    r.add_argument("--out", default="bench_multiturn_rollout.json")
    t = sub.add_parser("train", help="the math-tool example on SmolLM2: reward, turns, the environment's share")
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--out", default="bench_multiturn_train.json")
    t.add_argument("overrides", nargs="*", help="more train.py overrides")
    a = ap.parse_args(argv)
    if a.what == "rollout":
        if a.quick:
            a.prompts, a.n, a.max_new_tokens = 2, 2, 64
        if a.repeats < 5:
            ap.error("--repeats must be >= 5 (the median of at least five rounds is reported)")
    return a


# ---------------------------------------------------------------------------------------------- rollout
def _setup(args):
    """The tokenizer, the model, the prompt batch and the turn loop (the math-tool environment)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlopti.config import RolloutConfig
    from arlopti.config.schema import EnvConfig
    from arlopti.models.loading import smollm2_local_path
    from arlopti.prompts.batch import collate_prompts
    from arlopti.prompts.records import PromptRecord, tokenize_records
    from arlopti.rollout.turns import build_turn_loop
    from arlopti.tasks.math import build_prompt
    from arlopti.tasks.math.readers import read_math_file
    from arlopti.utils.precision import native_bf16

    if args.tiny:
        from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer

        dtype, tok = "float32", build_tiny_tokenizer()
        model = build_tiny_model(tok).eval()
    else:
        dtype = "bfloat16" if native_bf16("cpu")[0] else "float32"
        path = smollm2_local_path()
        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    problems = read_math_file(FIXTURE, limit=args.prompts)
    recs = [PromptRecord(uid=f"math/dsr/{i}", ground_truth=p.answer, task="math", **build_prompt(p.problem, "chat"))
            for i, p in enumerate(problems)]
    batch = collate_prompts(tokenize_records(recs, tok, 4096, "bench")[0])
    rc = RolloutConfig(max_turns=args.turns, max_new_tokens=args.max_new_tokens, stop=["```output"],
                       max_episode_tokens=args.turns * args.max_new_tokens + 1024, max_reply_tokens=2304)
    loop = build_turn_loop(rc, EnvConfig(env="arlopti.tasks.env.math_tool:MathToolEnv", max_error_frac=None), tok)
    return tok, model, dtype, batch, rc, loop


def _multi(engine, loop, batch, n, sampling):
    from arlopti.rollout.source import collect_groups

    t0 = time.perf_counter()
    groups = collect_groups(engine.generate, batch.prompt_ids, n, sampling, turns=loop, batch=batch)
    wall = time.perf_counter() - t0
    eps = [e for g in groups for e in g]
    sampled = sum(sum(e.trainable) for e in eps)
    env_s = sum(e.meta["env_s"] for e in eps)
    return {"tokens": sampled, "seconds": wall, "env_s": env_s, "tok_per_s": sampled / wall,
            "tok_per_s_without_env": sampled / max(1e-9, wall - env_s), "env_share": env_s / wall,
            "turns_mean": statistics.fmean(e.meta["turns"] for e in eps), "turns_max": max(e.meta["turns"] for e in eps),
            "tool_calls": sum(e.meta["tool_calls"] for e in eps), "env_tokens": sum(e.meta["env_tokens"] for e in eps),
            "episodes": len(eps)}, groups


def _single(engine, prompt_ids, n, sampling, length):
    t0 = time.perf_counter()
    groups = engine.generate(prompt_ids, n, sampling)
    wall = time.perf_counter() - t0
    lengths = {len(c.token_ids) for g in groups for c in g}
    if lengths != {length}:
        raise RuntimeError(f"{type(engine).__name__}: single-turn lengths {sorted(lengths)} != {length}")
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return {"tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall}


class _Engines:
    """Each engine's multi-turn generate and its exact-length single-turn generate."""

    def __init__(self, names, model, tok, dtype, batch, rc, n):
        from arlopti.config import RolloutConfig
        from arlopti.rollout.hf import HFEngine

        L, self.build_s = rc.max_new_tokens, {}
        self.multi, self.single = {}, {}
        if "hf" in names:
            self.multi["hf"] = HFEngine(model, tok, generation_batch_size=len(batch.prompt_ids) * n)
            self.single["hf"] = HFEngine(model, tok, generation_batch_size=len(batch.prompt_ids) * n, min_new_tokens=L)
        if "vllm" in names:
            from arlopti.rollout.vllm import VLLMEngine

            t0 = time.perf_counter()
            longest = max(len(p) for p in batch.prompt_ids) + 512 + rc.episode_tokens
            cfg = RolloutConfig(backend="vllm", dtype=dtype, max_new_tokens=L, enforce_eager=True, max_model_len=longest)
            self.vllm = VLLMEngine.from_policy(model, tok, cfg)
            self.build_s["vllm"] = time.perf_counter() - t0
            self.multi["vllm"] = self.vllm
            self.single["vllm"] = _MinTokens(self.vllm, L)

    def close(self):
        if hasattr(self, "vllm"):
            self.vllm.close()


class _MinTokens:
    """The vLLM engine with EOS suppressed for exactly ``length`` tokens (``min_tokens``) during a call."""

    def __init__(self, engine, length):
        self.engine, self.length = engine, length

    def generate(self, prompt_ids, n, sampling):
        old = dict(getattr(self.engine, "extra_sampling_kwargs", {}) or {})
        self.engine.extra_sampling_kwargs = {**old, "min_tokens": self.length}
        try:
            return self.engine.generate(prompt_ids, n, sampling)
        finally:
            self.engine.extra_sampling_kwargs = old


def rollout(args) -> dict:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(os.cpu_count() or 1)
    from arlopti.rollout.engine import SamplingConfig

    tok, model, dtype, batch, rc, loop = _setup(args)
    names = [e for e in args.engines.split(",") if e]
    engines = _Engines(names, model, tok, dtype, batch, rc, args.n)
    L = args.max_new_tokens
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=L, stop=("```output",), seed=1234)
    single_sampling = SamplingConfig(temperature=0.7, max_new_tokens=L, seed=1234)
    first = {}
    for name in names:  # warm-up (not counted); it also gives each episode's first prompt
        _, groups = _multi(engines.multi[name], loop, batch, args.n, sampling)
        first[name] = [g[0].prompt_ids or batch.prompt_ids[i] for i, g in enumerate(groups)]
        _single(engines.single[name], first[name], args.n, single_sampling, L)
    rounds = [{name: {} for name in names} for _ in range(args.repeats)]
    order = list(interleaved_order(names, args.repeats))
    for k, name in enumerate(order):
        r = k // len(names)
        multi, _ = _multi(engines.multi[name], loop, batch, args.n, sampling)
        single = _single(engines.single[name], first[name], args.n, single_sampling, L)
        rounds[r][name] = {"multi": multi, "single": single, "ratio": multi["tok_per_s"] / single["tok_per_s"]}
        print(f"round {r + 1} {name:5s}: multi-turn {multi['tok_per_s']:7.1f} tok/s ({multi['turns_mean']:.2f} turns, "
              f"env {100 * multi['env_share']:.1f}%), single-turn {single['tok_per_s']:7.1f} tok/s, ratio "
              f"{rounds[r][name]['ratio']:.2f}", flush=True)
    engines.close()
    summary = {}
    for name in names:
        rs = [r[name] for r in rounds]
        summary[name] = {
            "multi_tok_per_s": statistics.median(x["multi"]["tok_per_s"] for x in rs),
            "multi_tok_per_s_without_env": statistics.median(x["multi"]["tok_per_s_without_env"] for x in rs),
            "single_tok_per_s": statistics.median(x["single"]["tok_per_s"] for x in rs),
            "ratio_multi_over_single": statistics.median(x["ratio"] for x in rs),
            "env_share": statistics.median(x["multi"]["env_share"] for x in rs),
            "turns_mean": rs[0]["multi"]["turns_mean"], "turns_max": rs[0]["multi"]["turns_max"],
            "tool_calls": rs[0]["multi"]["tool_calls"], "sampled_tokens": rs[0]["multi"]["tokens"],
            "env_tokens": rs[0]["multi"]["env_tokens"], "episodes": rs[0]["multi"]["episodes"]}
    result = {"model": "tiny" if args.tiny else "SmolLM2-135M-Instruct", "dtype": dtype, "prompts": args.prompts, "n": args.n,
              "turns": args.turns, "max_new_tokens": L, "repeats": args.repeats, "vllm_build_s": engines.build_s,
              "summary": summary, "rounds": rounds}
    print()
    print(f"{args.prompts} DSR-Uniform prompts x n={args.n}, <= {args.turns} turns of <= {L} tokens, T=0.7, {dtype}; "
          f"median of {args.repeats} alternating rounds")
    cols = ["engine", "multi tok/s", "without env", "single tok/s", "multi/single", "env share", "turns", "tool calls"]
    print(format_table([{"engine": k, "multi tok/s": v["multi_tok_per_s"], "without env": v["multi_tok_per_s_without_env"],
                         "single tok/s": v["single_tok_per_s"], "multi/single": v["ratio_multi_over_single"],
                         "env share": v["env_share"], "turns": v["turns_mean"], "tool calls": v["tool_calls"]}
                        for k, v in summary.items()], cols))
    m = machine_info()
    print(f"{m['cpu']}, {m['cores']} CPUs, load {m['load_avg_1_5_15']}; wrote {write_json(args.out, result)}")
    return result


# ---------------------------------------------------------------------------------------------- train
def _float(row: dict, key: str) -> float | None:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else None


def _step_rows(metrics_csv: Path) -> list[dict]:
    with open(metrics_csv) as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("reward/mean")]
    out = []
    for r in rows:
        timings = {k: float(v) for k, v in r.items() if k.startswith("timing/") and k.endswith("_s") and v
                   and k not in ("timing/env_s", "timing/eval_s", "timing/diagnostics_s", "timing/tokens_per_s")}
        step_s = sum(timings.values())
        env_s = _float(r, "timing/env_s") or 0.0
        out.append({"step": int(float(r["step"])), "reward": _float(r, "reward/mean"),
                    "accuracy": _float(r, "reward/accuracy"), "turns_mean": _float(r, "turns/mean"),
                    "turns_max": _float(r, "turns/max"), "tool_calls": _float(r, "turns/tool_calls"),
                    "tool_errors": _float(r, "turns/tool_errors"), "env_token_frac": _float(r, "turns/env_token_frac"),
                    "env_s": env_s, "step_s": step_s, "env_share": env_s / step_s if step_s else None,
                    "timings": timings})
    return out


def train(args) -> dict:
    run_dir = OUT_DIR / "math_tool_run"
    cmd = [sys.executable, "train.py", "experiment=math_tool", f"rollout_steps={args.steps}", "logger=csv",
           f"hydra.run.dir={run_dir}", *args.overrides]
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"train.py failed (exit {done.returncode}); its log is under {run_dir}")
    found = sorted(run_dir.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no metrics.csv under {run_dir}")
    rows = _step_rows(found[-1])
    cols = ["step", "reward", "accuracy", "turns_mean", "turns_max", "tool_calls", "tool_errors", "env_s", "step_s",
            "env_share"]
    print(format_table(rows, cols))
    share = sum(r["env_s"] for r in rows) / sum(r["step_s"] for r in rows)
    print(f"{len(rows)} steps in {wall:.0f} s (the whole command); the environment's share of the step time: "
          f"{100 * share:.1f}%")
    result = {"command": "python " + " ".join(cmd[1:]), "wall_s": wall, "steps": rows, "env_share": share}
    print(f"wrote {write_json(args.out, result)}")
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    return rollout(args) if args.what == "rollout" else train(args)


if __name__ == "__main__":
    main()
