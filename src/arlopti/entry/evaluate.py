"""``eval.py``'s logic: evaluate a model or a training checkpoint on a benchmark suite.

A suite config (``configs/eval/*.yaml``) names a task and its sets:

* ``task: math``: ``benchmarks`` from :mod:`arlopti.tasks.math.benchmarks`, ``template`` raw|chat;
* ``task: kk``: ``people`` (e.g. [3, 4, 5, 6, 7]) read as ``kk_test_{N}ppl.jsonl`` from
  ``data_dir`` (the official 100-puzzle test sets), ``template`` official (the records' own prompt)|qwen-instruct|base;
* ``source: data`` (``eval=val``): the validation sets of the ``data`` config (any
  PromptDataModule, e.g. ``data=prompts``), each prompt scored by the task its record names, so
  any registered task, ``task=custom`` included (:func:`data_records`);

plus the sampling: either ``modes: [{name, temperature, top_p, top_k, n}, ...]`` or the flat
``samples_per_problem / temperature / top_p / top_k`` of one mode, and ``max_new_tokens``,
``limit`` (null = every problem; 0 is an error). The results (metrics of
:mod:`arlopti.eval.runner`, the config and the model) are written as JSON and printed as a table.

The model: ``ckpt_path`` (a training checkpoint file / FSDP2 folder, a training run directory, or
``last``), else the ``model`` config. ``ckpt_path=last`` means what it means in ``train.py``: the
newest intact ``last.ckpt`` of the training run ``logs/<train_task>/<train_run>/<time>/``
(``train_task`` = the experiment's ``task_name``, e.g. ``kk_lopti``; ``train_run`` = its
``run_name``, e.g. ``e0.5_s42``, which may be left out when ``logs/<train_task>`` holds one run
name). Weights that are not finite (a diverged run) are refused, naming the checkpoint and the
first bad tensor; a suite with no problems (an empty set, ``limit=0``) is an error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from arlopti.prompts.batch import PromptSample
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
        from arlopti.tasks.math.benchmarks import load_benchmark
        from arlopti.tasks.math.prompts import build_prompt

        for name in suite["benchmarks"]:
            items = load_benchmark(name, data_dir=suite.get("data_dir"), limit=limit)
            out[name] = [PromptRecord(uid=it.uid, ground_truth=it.answer, task="math", meta={"dataset": name},
                                      **build_prompt(it.problem, suite.get("template", "raw"))) for it in items]
    elif task == "kk":
        from arlopti.prompts.readers import read_records
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
            rows = rows[:limit] if limit is not None else rows
            recs = []
            for i, (where, row) in enumerate(rows):
                p = Puzzle.from_record(row, source=where)
                recs.append(build_prompt(p, suite.get("template", "official")).to_prompt_record(
                    uid=f"kk/test{n}/{i}", ground_truth=p.solution_text_format, meta={"n_people": n}))
            out[f"kk_{n}ppl"] = recs
    else:
        raise ValueError(f"eval.task={task!r}: the suites read their own files for 'math' and 'kk' only; any "
                         "registered task (task=custom too) is evaluated on its data config's validation sets "
                         "with eval=val data=<its data config> (configs/eval/val.yaml)")
    return out


def data_records(cfg: DictConfig) -> tuple[dict[str, list[PromptRecord]], int]:
    """``eval=val``: the validation sets of ``cfg.data`` (a PromptDataModule config; read, not yet
    tokenised; ``eval.limit`` = the first N of each) and the data's validation prompt-length limit
    (``val_max_prompt_length``, else ``max_prompt_length``)."""
    import hydra
    from omegaconf import open_dict

    if cfg.get("data") is None:
        raise ValueError("eval=val evaluates the validation sets of a data config: pass one, e.g. data=prompts "
                         "data.train_file=... data.val_file=... (or data.val_fraction=...), as in training")
    with open_dict(cfg):
        cfg.data.prompts_per_step = 1  # a training-only size (its interpolation needs the training config)
    dm = hydra.utils.instantiate(cfg.data, tokenizer=None)
    records = dm.val_records()
    if not records:
        raise ValueError(f"eval=val: the data config ({cfg.data.get('_target_')}) has no validation set; give it "
                         "one (data=prompts: data.val_file=FILE or data.val_fraction=0.1)")
    limit = cfg.eval.get("limit")
    if limit is not None:
        records = {name: recs[:int(limit)] for name, recs in records.items()}
    return records, int(dm.val_max_prompt_length or dm.max_prompt_length)


def load_model_for_eval(cfg: DictConfig, ckpt: str | None = None):
    """(PolicyLM, tokenizer) from ``ckpt`` (default: :func:`eval_ckpt_path`, a training
    checkpoint) or the ``model`` config."""
    from arlopti.config import ModelConfig, from_dict
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import load_causal_lm, load_tokenizer

    m = from_dict(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    ckpt = ckpt or eval_ckpt_path(cfg)
    if ckpt:
        from arlopti.checkpoints.export import load_policy_from_checkpoint

        hf, tok = load_policy_from_checkpoint(ckpt)
        check_finite_weights(hf, f"checkpoint {ckpt}")
    else:
        tok = load_tokenizer(m.name_or_path, m.tiny.vocab_size)
        hf = load_causal_lm(m.name_or_path, tok, dtype=m.dtype, tiny=m.tiny)
        check_finite_weights(hf, f"model {m.name_or_path}")
    return PolicyLM(hf, m.logprob_impl), tok


def eval_ckpt_path(cfg: DictConfig) -> str | None:
    """The checkpoint ``ckpt_path`` names (None: evaluate the ``model`` config).

    ``last``: the newest intact ``last.ckpt`` of the training run ``train_task`` / ``train_run``
    (:func:`arlopti.checkpoints.resume.resolve_ckpt_path`, as ``train.py`` resolves it); without
    ``train_task``, a ``task_name`` / ``run_name`` other than eval's own are taken as the
    training run's. Otherwise a checkpoint file / folder or a run directory (its ``last.ckpt``).
    Resolved and checked by :func:`arlopti.checkpoints.resume.resolve_ckpt_path`, as in ``train.py``."""
    from arlopti.checkpoints.resume import resolve_ckpt_path, run_names

    ckpt = cfg.get("ckpt_path")
    if ckpt in (None, ""):
        return None
    if str(ckpt) == "auto":
        raise ValueError("eval: ckpt_path=auto has no meaning here (eval writes no checkpoints); use "
                         "ckpt_path=last with train_task=<the experiment's task_name>, or a checkpoint path")
    if str(ckpt) != "last":
        return resolve_ckpt_path(ckpt)
    log_dir = Path(cfg.paths.log_dir)
    task = cfg.get("train_task") or (cfg.task_name if cfg.get("task_name") not in (None, "eval") else None)
    if not task:
        raise ValueError("eval: ckpt_path=last needs the training run: pass "
                         "train_task=<the experiment's task_name> (e.g. train_task=kk_lopti) and, when logs/<train_task> holds several runs, "
                         f"train_run=<its run_name> (runs are under {log_dir}/<task_name>/<run_name>/<time>)")
    own_run_names = (None, "eval", (cfg.get("eval") or {}).get("name"))  # eval's own folder, not a training run
    run = cfg.get("train_run") or (cfg.get("run_name") if cfg.get("train_task") is None and cfg.get("run_name")
                                   not in own_run_names else None)
    if not run:
        names = run_names(log_dir, str(task))
        if len(names) != 1:
            raise ValueError(f"eval: ckpt_path=last train_task={task}: {log_dir / str(task)} holds "
                             f"{'no training runs' if not names else 'the runs ' + ', '.join(names)}; "
                             "pass train_run=<run_name>" + ("" if not names else " (one of those)"))
        run = names[0]
    path = resolve_ckpt_path("last", output_dir=None, log_dir=log_dir, task_name=str(task), run_name=str(run))
    log.info("ckpt_path=last: evaluating %s (train_task=%s, train_run=%s)", path, task, run)
    return path


def check_finite_weights(model, what: str) -> None:
    """Refuse a model with NaN / inf weights: it would score every response as garbage with no
    warning. The error names ``what`` (the checkpoint) and the first bad tensor."""
    from arlopti.checkpoints.resume import first_nonfinite

    found = first_nonfinite(model.state_dict().items())
    if found is not None:
        name, bad, numel = found
        raise ValueError(f"{what} holds non-finite weights: first bad tensor {name!r} ({bad} of {numel} "
                         "values NaN/inf); the run diverged or the file is corrupt. Evaluate an earlier "
                         "checkpoint.")


def eval_suite(cfg: DictConfig) -> tuple[dict, dict[str, list[PromptRecord]]]:
    """The suite (``cfg.eval``, resolved) and its records per set, checked before any model is
    loaded so that a bad suite fails fast: ``eval=val`` (``source: data``) reads the data config's
    validation sets (any registered task), other suites their own sets."""
    suite = OmegaConf.to_container(cfg.eval, resolve=True)
    limit = suite.get("limit")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"eval.limit={limit}: evaluate at least one problem per set (null = all of them)")
    if suite.get("source") == "data":
        records, max_len = data_records(cfg)
        suite["max_prompt_length"] = suite.get("max_prompt_length") or max_len
        suite["task"] = "/".join(sorted({r.task for recs in records.values() for r in recs})) or "none"
    else:
        records = suite_records(suite)
    empty = [name for name, recs in records.items() if not recs]
    if not records or empty:
        raise ValueError(f"eval suite {suite.get('name', suite['task'])!r} has nothing to evaluate: "
                         + (f"set(s) {empty} hold no problems" if empty else "it names no sets"))
    return suite, records


def tokenize_sets(records: dict[str, list[PromptRecord]], tok,
                  max_prompt_length: int) -> dict[str, list[PromptSample]]:
    """Every set's prompts tokenized (longer ones dropped); a set left empty is an error."""
    sets: dict[str, list[PromptSample]] = {}
    for name, recs in records.items():
        sets[name], dropped = tokenize_records(recs, tok, max_prompt_length, name)
        if not sets[name]:
            raise ValueError(f"eval set {name!r}: all {len(recs)} prompts are longer than "
                             f"eval.max_prompt_length={max_prompt_length}")
    return sets


def evaluate(cfg: DictConfig) -> dict:
    """Evaluate the checkpoint or model of ``cfg`` on its suite; writes and returns the report."""
    from arlopti.config import RolloutConfig, from_dict
    from arlopti.rollout.factory import build_engine
    from arlopti.tasks.base import check_task_options, get_task
    from arlopti.utils.console import quiet_console

    quiet_console()
    suite, records = eval_suite(cfg)
    record_tasks = sorted({r.task for recs in records.values() for r in recs})
    task_options = OmegaConf.to_container(cfg.tasks, resolve=True) if cfg.get("tasks") else {}
    check_task_options({t: task_options.get(t) for t in record_tasks}, required=tuple(record_tasks))
    ckpt = eval_ckpt_path(cfg)
    policy, tok = load_model_for_eval(cfg, ckpt)
    sets = tokenize_sets(records, tok, int(suite.get("max_prompt_length", 4096)))
    rollout = from_dict(RolloutConfig, OmegaConf.to_container(cfg.rollout, resolve=True), "rollout")
    engine = build_engine(rollout, policy, tok)
    tasks: dict = {}
    check_task_options(task_options)

    def task_for(name):
        if name not in tasks:
            tasks[name] = get_task(name, **(task_options.get(name) or {}))
        return tasks[name]

    try:
        metrics, results = evaluate_sets(engine, sets, {t: suite_modes(suite) for t in record_tasks}, task_for,
                                         int(suite["max_new_tokens"]), seed=int(cfg.seed), keep_samples=2,
                                         keep_items=True)
    finally:
        for t in tasks.values():
            t.close()
        engine.close()
    return write_report(cfg, suite, ckpt, task_options, metrics, results)


def write_report(cfg: DictConfig, suite: dict, ckpt: str | None, task_options: dict, metrics: dict,
                 results: list) -> dict:
    """Write the report (``cfg.output_file``, every item beside it), print the table; returns it."""
    from arlopti.eval.runner import attach_items, mean_sets

    report = {"suite": suite, "model": ckpt or cfg.model.name_or_path, "tasks": task_options,
              "mean_over": mean_sets(results),
              "metrics": metrics,
              "sets": [{"name": r.name, "mode": r.mode, "problems": r.problems, "n": r.n, "samples": r.samples}
                       for r in results]}
    out = Path(cfg.output_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    attach_items(report, results, out.parent)  # every item (arlopti.eval.compare); responses in eval_items.jsonl.gz
    out.write_text(json.dumps(report, indent=2, default=str))
    print_table(metrics, model=checkpoint_model_name(ckpt) if ckpt else str(cfg.model.name_or_path), ckpt=ckpt,
                results=results)
    print(f"results written to {out}")
    return report


def checkpoint_model_name(ckpt: str) -> str:
    """The ``model.name_or_path`` a training checkpoint was trained from (its saved run config), or
    ``"?"`` when it records none."""
    from arlopti.checkpoints.resume import load_checkpoint_metadata

    run = (load_checkpoint_metadata(ckpt).get("hyper_parameters") or {}).get("run") or {}
    return str((run.get("model") or {}).get("name_or_path", "?"))


def print_table(metrics: dict[str, float], model: str | None = None, ckpt: str | None = None,
                results: list | None = None) -> None:
    """The metrics per (set, mode), titled with the model and the checkpoint; ``results`` adds the
    columns ``n`` (problems) and ``k`` (samples per problem)."""
    from rich.console import Console
    from rich.table import Table

    rows: dict[tuple[str, str], dict[str, float]] = {}
    for key, v in metrics.items():
        parts = key.split("/")
        if len(parts) == 5 and parts[0] == "val":
            rows.setdefault((parts[2], parts[3]), {})[parts[4]] = v
    cols = sorted({c for r in rows.values() for c in r})
    sizes = {(r.name, r.mode): (r.problems, r.n) for r in results or []}
    title = "evaluation" + (f": model {model}" if model else "") + f", checkpoint {ckpt or 'none (the model config)'}"
    print(title)  # plain print: rich would wrap the title at the table's width and split the path
    table = Table()
    table.add_column("set")
    table.add_column("mode")
    if sizes:
        table.add_column("n", justify="right")
        table.add_column("k", justify="right")
    for c in cols:
        table.add_column(c, justify="right")
    for (name, mode), r in sorted(rows.items(), key=lambda kv: (kv[0][0] == "mean", kv[0])):
        size = [str(x) for x in sizes.get((name, mode), ("-", "-"))] if sizes else []
        table.add_row(name, mode, *size, *[f"{r[c]:.4f}" if c in r else "-" for c in cols])
    Console().print(table)
