"""Evaluate a policy on prompt sets through a rollout engine: the core of validation and ``eval.py``.

An :class:`EvalMode` is one way of sampling (the official K&K validation uses two: greedy and
one sample at T = 1; the official math protocol one: 16 samples at T = 1). For every set, mode
and prompt, ``n`` responses are generated and scored with the set's task, giving a
``[problems, n]`` correctness matrix, and from it:

* ``acc`` (n = 1): the fraction of correct responses;
* ``avg@n`` (n > 1): mean correctness over all n·problems samples (mean pass@1);
* ``pass@n`` (n > 1): fraction of problems with at least one correct sample;
* ``reward``: mean task reward; for K&K also ``format_rate`` (the format check passed).

Metric keys: ``val/<task>/<set>/<mode>/<metric>``, plus ``val/<task>/mean/<mode>/<metric>``
averaged over the sets (unweighted, as the paper averages benchmarks) and
``val/<task>/mean/sets``, the number of sets that mean is over (the set names are logged; see
:func:`mean_sets`). A set without prompts (every prompt over the length limit; the DataModules
refuse empty files) is left out with a warning naming it, and ``.../mean/sets`` shows it. Under data parallelism
each rank evaluates every ``world``-th prompt and ``reduce_sum`` adds the counts up; a rank whose share
of a set is empty (fewer prompts than ranks) takes part in every sum and reports the same metrics.

With ``keep_items=True`` every response is also kept as one record in ``SetResult.items``
(:func:`item_records`): ``uid``, ``set``, ``mode``, ``sample`` (0..n-1), ``reward``, ``correct``,
``answer`` (the task's extracted answer, :func:`extracted_answer`, or None), ``response`` and
``components`` (the reward's named parts; for ``task=custom`` every extra key the reward returned).
``eval.py`` writes them (``eval_results.json`` and ``eval_items.jsonl.gz``) so that two evaluations
can be compared item by item (:mod:`arlopti.eval.compare`). The records are this rank's only.

With ``turns`` (a :class:`~arlopti.rollout.turns.TurnLoop`: validation of a run with ``task.env``) each
response is a multi-turn episode (:func:`arlopti.rollout.source.collect_groups`): the task scores its
final turn and the environment's reward is added, as in training.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from arlopti.prompts.batch import PromptSample
from arlopti.rollout.engine import RolloutEngine, SamplingConfig
from arlopti.tasks.base import Task

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class EvalMode:
    name: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1


GREEDY = EvalMode("greedy", 0.0, 1.0, -1, 1)
KK_MODES = (GREEDY, EvalMode("sampling", 1.0, 1.0, -1, 1))
MATH_MODES = (EvalMode("sampling", 1.0, 1.0, -1, 16),)


@dataclass
class SetResult:
    """Counts for one (set, mode), summed over ranks, and a few local samples for inspection."""

    name: str
    task: str
    mode: str
    problems: int
    n: int
    correct: float  # correct responses
    passed: float  # problems with at least one correct response
    reward: float  # sum of rewards
    format_ok: float | None = None  # responses that passed the format check (K&K)
    samples: list[dict] = field(default_factory=list)
    items: list[dict] = field(default_factory=list)  # keep_items=True: one record per response (item_records)


def extracted_answer(task: Task, response: str) -> str | None:
    """The answer ``task`` reads from ``response``: its ``extract_answer(response)`` method when it
    has one (K&K: the last ``<answer>`` span; math: the last ``\\boxed{}``), else None."""
    fn = getattr(task, "extract_answer", None)
    if fn is None:
        return None
    out = fn(response)
    return None if out is None else str(out)


def item_records(set_name: str, mode: str, samples: list[PromptSample], texts: list[str], scored: list,
                 n: int, task: Task) -> list[dict]:
    """One record per response, in generation order: response ``j`` of prompt ``i`` is
    ``texts[i * n + j]`` and ``scored[i * n + j]`` (how :func:`evaluate_sets` flattens them)."""
    out = []
    for k, (text, r) in enumerate(zip(texts, scored)):
        s = samples[k // n]
        out.append({"uid": str(s.uid), "set": set_name, "mode": mode, "sample": k % n, "reward": float(r.reward),
                    "correct": bool(r.correct), "answer": extracted_answer(task, text), "response": text,
                    "components": {k: float(v) for k, v in r.components.items()}})
    return out


#: The correctness metrics :func:`metrics_of` names: ``acc``, ``avg@n``, ``pass@n``.
ACCURACY_METRIC = re.compile(r"acc|(avg|pass)@\d+")


def is_accuracy_key(key: str) -> bool:
    """Whether a ``val/<task>/<set>/<mode>/<metric>`` key holds one of :func:`metrics_of`'s
    correctness metrics (not ``reward``, ``format_rate`` or ``sets``)."""
    return ACCURACY_METRIC.fullmatch(key.rsplit("/", 1)[-1]) is not None


def metrics_of(res: SetResult) -> dict[str, float]:
    total = max(1, res.problems * res.n)
    out: dict[str, float] = {}
    if res.n == 1:
        out["acc"] = res.correct / total
    else:
        out[f"avg@{res.n}"] = res.correct / total
        out[f"pass@{res.n}"] = res.passed / max(1, res.problems)
    out["reward"] = res.reward / total
    if res.format_ok is not None:
        out["format_rate"] = res.format_ok / total
    return out


def evaluate_sets(engine: RolloutEngine, sets: dict[str, list[PromptSample]], modes: dict[str, tuple[EvalMode, ...]],
                  task_for: Callable[[str], Task], max_new_tokens: int, seed: int = 0, limit: int | None = None,
                  rank: int = 0, world: int = 1, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  keep_samples: int = 0, keep_items: bool = False, turns=None) -> tuple[dict[str, float], list[SetResult]]:
    """Generate and score every set under every mode of its task; return (metrics, per-set results).
    ``keep_items``: also keep every response's record (:func:`item_records`) in ``SetResult.items``;
    ``turns``: multi-turn episodes (module docstring)."""
    metrics: dict[str, float] = {}
    results: list[SetResult] = []
    per_task_mode: dict[tuple[str, str], list[dict[str, float]]] = {}
    t0 = time.perf_counter()
    empty = [name for name, samples in sets.items() if not samples]
    if empty and rank == 0:  # every prompt over the length limit (the DataModules refuse empty files)
        log.warning("validation set(s) %s hold no prompts: not evaluated, not in val/<task>/mean", empty)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit}: evaluate at least one prompt per set (null = all)")
    for set_name, samples in sets.items():
        if not samples:
            continue
        samples = samples[:limit] if limit else samples
        task_name = samples[0].task
        for mode in modes.get(task_name, (GREEDY,)):
            sampling = SamplingConfig(temperature=mode.temperature, top_p=mode.top_p, top_k=mode.top_k,
                                      max_new_tokens=max_new_tokens, seed=seed)
            res = evaluate_mode(engine, set_name, task_name, samples[rank::world], mode, sampling, task_for,
                                reduce_sum, keep_samples, keep_items, turns)
            results.append(res)
            m = metrics_of(res)
            per_task_mode.setdefault((task_name, mode.name), []).append(m)
            for k, v in m.items():
                metrics[f"val/{task_name}/{set_name}/{mode.name}/{k}"] = v
    metrics.update(mean_metrics(per_task_mode, results, rank))
    metrics["timing/eval_s"] = time.perf_counter() - t0
    return metrics, results


def evaluate_mode(engine: RolloutEngine, set_name: str, task_name: str, mine: list[PromptSample], mode: EvalMode,
                  sampling: SamplingConfig, task_for: Callable[[str], Task],
                  reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None, keep_samples: int = 0,
                  keep_items: bool = False, turns=None) -> SetResult:
    """One set under one mode: this rank's prompts ``mine`` generated (every rank calls, even with none:
    FSDP2 ranks must join the unshard) and scored by the set's task; the counts summed over ranks with
    ``reduce_sum``, so the :class:`SetResult` is the whole set's."""
    from arlopti.prompts.batch import collate_prompts
    from arlopti.rollout.source import collect_groups
    from arlopti.rollout.turns import with_env_rewards
    from arlopti.tasks.base import with_prompt

    comps = collect_groups(engine.generate, [s.prompt_ids for s in mine], mode.n, sampling, turns=turns,
                           batch=collate_prompts(mine))  # one generate call unless multi-turn
    texts = [c.text for cs in comps for c in cs]
    gts = [s.ground_truth for s, cs in zip(mine, comps) for _ in cs]
    metas = [with_prompt(s.meta, s.messages, s.prompt_text) for s, cs in zip(mine, comps) for _ in cs]
    scored = task_for(task_name).score(texts, gts, metas) if texts else []
    scored = with_env_rewards(scored, [c for cs in comps for c in cs])
    correct = torch.tensor([float(r.correct) for r in scored], dtype=torch.float64).view(len(mine), mode.n)
    stats = torch.tensor([
        float(len(mine)), float(correct.sum()),
        float(correct.max(dim=1).values.sum()) if correct.numel() else 0.0,
        float(sum(r.reward for r in scored)),
        float(sum(r.components.get("format_ok", 0.0) for r in scored)),
        # whether the task reports a format check, summed too: a rank whose share is empty has no score to
        # tell, and every rank must report the same metrics
        float(bool(scored) and "format_ok" in scored[0].components),
    ], dtype=torch.float64)
    if reduce_sum is not None:
        stats = reduce_sum(stats).double().cpu()
    res = SetResult(set_name, task_name, mode.name, int(stats[0]), mode.n, float(stats[1]),
                    float(stats[2]), float(stats[3]), float(stats[4]) if stats[5] > 0 else None)
    res.samples = [{"prompt": s.prompt_text[-400:], "response": cs[0].text, "correct": bool(correct[i, 0])}
                   for i, (s, cs) in enumerate(zip(mine[:keep_samples], comps[:keep_samples]))]
    if keep_items:
        res.items = item_records(set_name, mode.name, mine, texts, scored, mode.n, task_for(task_name))
    return res


def mean_metrics(per_task_mode: dict[tuple[str, str], list[dict[str, float]]], results: list[SetResult],
                 rank: int = 0) -> dict[str, float]:
    """``val/<task>/mean/<mode>/<k>``: each metric's mean over the task's sets under that mode, and
    ``val/<task>/mean/sets``: how many sets that is (:func:`mean_sets`, logged on rank 0)."""
    metrics: dict[str, float] = {}
    for (task_name, mode_name), rows in per_task_mode.items():
        for k in rows[0]:
            metrics[f"val/{task_name}/mean/{mode_name}/{k}"] = sum(r[k] for r in rows) / len(rows)
    for task_name, names in mean_sets(results).items():
        metrics[f"val/{task_name}/mean/sets"] = float(len(names))
        if rank == 0:
            log.info("val/%s/mean averages over %d set(s): %s", task_name, len(names), ", ".join(names))
    return metrics


def mean_sets(results: list[SetResult]) -> dict[str, list[str]]:
    """The sets each task's ``val/<task>/mean/...`` metrics average over, in order."""
    out: dict[str, list[str]] = {}
    for r in results:
        names = out.setdefault(r.task, [])
        if r.name not in names:
            names.append(r.name)
    return out


#: The side file beside ``eval_results.json`` holding every item record with its response.
ITEMS_FILE = "eval_items.jsonl.gz"


def attach_items(report: dict, results: list[SetResult], out_dir) -> None:
    """Put every item record of ``results`` into ``report["items"]`` without its response (uid,
    set, mode, sample, reward, correct, answer), and write the full records, responses included,
    one JSON line each, to ``<out_dir>/eval_items.jsonl.gz`` (``report["items_file"]``), so that
    ``eval_results.json`` stays small whatever the response lengths."""
    import gzip
    import json
    from pathlib import Path

    records = [it for r in results for it in r.items]
    report["items"] = [{k: v for k, v in it.items() if k != "response"} for it in records]
    report["items_file"] = ITEMS_FILE
    path = Path(out_dir) / ITEMS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for it in records:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


def read_items(results_file) -> list[dict]:
    """The full item records (responses included) of an ``eval_results.json``: its side file
    ``eval_items.jsonl.gz`` when present, else the response-less ``items`` of the JSON."""
    import gzip
    import json
    from pathlib import Path

    path = Path(results_file)
    report = json.loads(path.read_text())
    side = path.parent / report.get("items_file", ITEMS_FILE)
    if side.is_file():
        with gzip.open(side, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    return list(report.get("items", []))
