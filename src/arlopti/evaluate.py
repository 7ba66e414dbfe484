"""``eval.py``'s logic: evaluate a model or a training checkpoint on a benchmark suite.

A suite config (``configs/eval/*.yaml``) names a task and its sets:

* ``task: math``: ``benchmarks`` from :mod:`arlopti.eval.benchmarks`, ``template`` raw|chat;
* ``task: kk``: ``people`` (e.g. [3, 4, 5, 6, 7]) read as ``kk_test_{N}ppl.jsonl`` from
  ``data_dir`` (the official 100-puzzle test sets), ``template`` official (the records' own prompt)|qwen-instruct|base;

plus the sampling: either ``modes: [{name, temperature, top_p, top_k, n}, ...]`` or the flat
``samples_per_problem / temperature / top_p / top_k`` of one mode, and ``max_new_tokens``,
``limit``. The results (metrics of :mod:`arlopti.eval.runner`, the config and the model) are
written as JSON and printed as a table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from arlopti.data.batch import PromptSample
from arlopti.data.prompt_datamodule import PromptRecord, tokenize_records
from arlopti.eval.runner import EvalMode, evaluate_sets

log = logging.getLogger(__name__)


def suite_modes(suite: dict) -> tuple[EvalMode, ...]:
    if suite.get("modes"):
        return tuple(EvalMode(**dict(m)) for m in suite["modes"])
    n = int(suite.get("samples_per_problem", 1))
    t = float(suite.get("temperature", 0.0))
    return (EvalMode("greedy" if t == 0 and n == 1 else "sampling", t, float(suite.get("top_p", 1.0)),
                     int(suite.get("top_k", -1)), n),)


def suite_records(suite: dict) -> dict[str, list[PromptRecord]]:
    task, limit = suite["task"], suite.get("limit")
    out: dict[str, list[PromptRecord]] = {}
    if task == "math":
        from arlopti.eval.benchmarks import load_benchmark
        from arlopti.tasks.math.prompts import build_prompt

        for name in suite["benchmarks"]:
            items = load_benchmark(name, data_dir=suite.get("data_dir"), limit=limit)
            out[name] = [PromptRecord(uid=it.uid, ground_truth=it.answer, task="math", meta={"dataset": name},
                                      **build_prompt(it.problem, suite.get("template", "raw"))) for it in items]
    elif task == "kk":
        from arlopti.data.readers import read_records
        from arlopti.tasks.kk import Puzzle, build_prompt
        from arlopti.tasks.kk.sources import find_layout

        tests = find_layout(suite["data_dir"]).test_files  # kk_test_{N}ppl.jsonl or test_{N}ppl.jsonl
        for n in suite["people"]:
            if n not in tests:
                raise FileNotFoundError(
                    f"eval.data_dir={suite['data_dir']} has no test file for N={n} (have {sorted(tests)}); point "
                    "eval.data_dir at the official K&K test sets or a `python -m arlopti.data.prepare kk` output")
            path = tests[n]
            rows = read_records(path)
            rows = rows[:limit] if limit else rows
            recs = []
            for i, (where, row) in enumerate(rows):
                p = Puzzle.from_record(row, source=where)
                recs.append(build_prompt(p, suite.get("template", "official")).to_prompt_record(
                    uid=f"kk/test{n}/{i}", ground_truth=p.solution_text_format, meta={"n_people": n}))
            out[f"kk_{n}ppl"] = recs
    else:
        raise ValueError(f"eval.task={task!r}: use 'math' or 'kk'")
    return out


def load_model_for_eval(cfg: DictConfig):
    """(PolicyLM, tokenizer) from ``ckpt_path`` (a training checkpoint) or the ``model`` config."""
    from arlopti.config import ModelConfig, from_dict
    from arlopti.learner.policy import PolicyLM
    from arlopti.models import load_causal_lm, load_tokenizer

    m = from_dict(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    if cfg.get("ckpt_path"):
        from arlopti.export import load_policy_from_checkpoint

        hf, tok = load_policy_from_checkpoint(cfg.ckpt_path)
    else:
        tok = load_tokenizer(m.name_or_path, m.tiny.vocab_size)
        hf = load_causal_lm(m.name_or_path, tok, dtype=m.dtype, tiny=m.tiny)
    return PolicyLM(hf, m.logprob_impl), tok


def evaluate(cfg: DictConfig) -> dict:
    from arlopti.config import RolloutConfig, from_dict
    from arlopti.callbacks.rollout import build_engine
    from arlopti.tasks.base import check_task_options, get_task

    suite = OmegaConf.to_container(cfg.eval, resolve=True)
    policy, tok = load_model_for_eval(cfg)
    records = suite_records(suite)
    sets: dict[str, list[PromptSample]] = {}
    for name, recs in records.items():
        sets[name], dropped = tokenize_records(recs, tok, int(suite.get("max_prompt_length", 4096)), name)
    rollout = from_dict(RolloutConfig, OmegaConf.to_container(cfg.rollout, resolve=True), "rollout")

    class _Holder:  # what build_engine reads off a module
        pass

    holder = _Holder()
    holder.policy, holder.tokenizer = policy, tok
    engine = build_engine(rollout, holder)
    tasks: dict = {}
    task_options = OmegaConf.to_container(cfg.tasks, resolve=True) if cfg.get("tasks") else {}
    check_task_options(task_options)

    def task_for(name):
        if name not in tasks:
            tasks[name] = get_task(name, **task_options.get(name, {}))
        return tasks[name]

    try:
        metrics, results = evaluate_sets(engine, sets, {suite["task"]: suite_modes(suite)}, task_for,
                                         int(suite["max_new_tokens"]), seed=int(cfg.seed), keep_samples=2)
    finally:
        for t in tasks.values():
            t.close()
        engine.close()
    report = {"suite": suite, "model": cfg.get("ckpt_path") or cfg.model.name_or_path, "tasks": task_options,
              "metrics": metrics,
              "sets": [{"name": r.name, "mode": r.mode, "problems": r.problems, "n": r.n, "samples": r.samples}
                       for r in results]}
    out = Path(cfg.output_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print_table(metrics)
    print(f"results written to {out}")
    return report


def print_table(metrics: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    rows: dict[tuple[str, str], dict[str, float]] = {}
    for key, v in metrics.items():
        parts = key.split("/")
        if len(parts) == 5 and parts[0] == "val":
            rows.setdefault((parts[2], parts[3]), {})[parts[4]] = v
    cols = sorted({c for r in rows.values() for c in r})
    table = Table(title="evaluation")
    table.add_column("set")
    table.add_column("mode")
    for c in cols:
        table.add_column(c, justify="right")
    for (name, mode), r in sorted(rows.items(), key=lambda kv: (kv[0][0] == "mean", kv[0])):
        table.add_row(name, mode, *[f"{r[c]:.4f}" if c in r else "-" for c in cols])
    Console().print(table)
