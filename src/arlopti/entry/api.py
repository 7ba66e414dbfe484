"""``arlopti.run``: a training run from Python (a script or a notebook), as ``python train.py`` runs it.

::

    import arlopti

    result = arlopti.run(["experiment=kk_grpo", "rollout_steps=50"])
    result = arlopti.run(["debug=smoke"], reward_fn=[correct, brevity], reward_weights=[1.0, 0.1],
                         train_data=[{"prompt": "What is 2 + 3?", "answer": "5"}, ...])
    result.run_dir, result.metrics["reward/mean"], result.checkpoint

One source of truth: the config is composed from the checkout's ``configs/`` by Hydra's own run
path (``Hydra.run``, what ``@hydra.main`` calls), so the run folder (``logs/<task_name>/<run_name>/<time>``),
``.hydra/``, ``train.log``, the console's step lines and the override checks
(:func:`arlopti.config.check_overrides`) are those of the command line; then :func:`arlopti.entry.train.train`.

The keywords only add overrides (every one is optional; ``docs/python_api.md``):

* ``reward_fn``: a callable, a ``module:function`` / ``file.py:function`` string, or a list of them
  -> ``task=custom task.reward_fn=...`` (one) or ``task.reward_fns=[...]`` (several). A callable
  runs in the killable worker pool when a fresh interpreter can import it by name, else in this
  process with the same timeout and error accounting (:mod:`arlopti.tasks.in_process`);
* ``reward_weights``: ``task.reward_weights=[...]``, one per reward function;
* ``env``: an environment class (either contract, :mod:`arlopti.tasks.env.base`) or a
  ``path/to/file.py:Class`` / ``module:Class`` string -> ``task.env=...`` (a class is kept in this
  process, :func:`arlopti.tasks.env.loading.register_env`); set ``rollout.max_turns`` in ``overrides``
  (docs/multi_turn.md);
* ``train_data``: a ``datasets.Dataset``, a list of dicts (written once to a JSON Lines file named
  by its content, under the system's temporary folder) or a path -> ``data=prompts
  data.train_file=...`` (``data=prompts`` only when no ``data=`` override is given).

A failure raises the run's own exception with its own message (Hydra's "Error executing job"
report is not printed); Ctrl-C saves the checkpoint and raises :class:`RunInterrupted`, a
``KeyboardInterrupt``, so that a loop of runs stops (docs/python_api.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclass
class RunResult:
    """What :func:`run` returns: the run folder, the last step's metrics (the learner's scalars,
    e.g. ``reward/mean``), the final checkpoint (None when none was written), the run summary
    (``summary.json``: start vs end, validation), the last validation results, the value of
    ``optimized_metric`` (None when it is not set) and, for a run a signal stopped early (SIGTERM,
    SIGUSR1; checkpoint saved), the signal's name (None when the run ended by itself)."""

    run_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    summary: dict = field(default_factory=dict)
    eval_results: dict = field(default_factory=dict)
    objective: float | None = None
    interrupted: str | None = None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped :func:`run`: the step in progress finished and the checkpoint was
    saved, then this is raised so that a loop of runs stops too. ``result`` is the
    :class:`RunResult` (``interrupted="SIGINT"``, ``checkpoint`` to resume from)."""

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


def _reward_overrides(reward_fn, reward_weights, chosen: set[str]) -> list[str]:
    from arlopti.config import ConfigError
    from arlopti.config.compose import quoted
    from arlopti.tasks.in_process import register_callable

    if reward_fn is None:
        if reward_weights is None:
            return []
        if "task" not in chosen:  # the weights weigh task=custom's reward functions: there are none
            raise ConfigError(f"reward_weights={list(reward_weights)} weighs the reward functions of task=custom, "
                              f"and none is given: pass reward_fn=[...] (one function per weight), or "
                              f"'task=custom' and 'task.reward_fns=[...]' in overrides")
        return [f"task.reward_weights=[{','.join(str(float(w)) for w in reward_weights)}]"]
    fns = list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn]
    if reward_weights is not None and len(list(reward_weights)) != len(fns):
        raise ConfigError(f"reward_weights={list(reward_weights)} has {len(list(reward_weights))} weights for "
                          f"{len(fns)} reward function(s) in reward_fn: give one weight per function")
    specs = [register_callable(f) if callable(f) else str(f) for f in fns]
    out = ["task=custom"]
    if len(specs) == 1 and reward_weights is None:
        out.append(f"task.reward_fn={quoted(specs[0])}")
    else:
        out.append(f"task.reward_fns=[{','.join(quoted(s) for s in specs)}]")
    if reward_weights is not None:
        out.append(f"task.reward_weights=[{','.join(str(float(w)) for w in reward_weights)}]")
    return out


def data_file(train_data: Any) -> str:
    """The path ``train_data`` stands for: a path as it is (absolute), else the rows of a
    ``datasets.Dataset`` / a list of dicts written to ``<tmp>/arlopti_train_data/<sha1>.jsonl``
    (the same rows give the same file, so a resumed run sees the same data identity)."""
    if isinstance(train_data, (str, os.PathLike)):
        return str(Path(train_data).resolve()) if Path(train_data).exists() else str(train_data)
    if hasattr(train_data, "to_list") and hasattr(train_data, "column_names"):  # a datasets.Dataset
        rows = train_data.to_list()
    elif isinstance(train_data, Sequence) and all(isinstance(r, dict) for r in train_data):
        rows = list(train_data)
    else:
        raise TypeError(f"train_data: expected a datasets.Dataset, a list of dicts or a path, got "
                        f"{type(train_data).__name__}")
    if not rows:
        raise ValueError("train_data holds no rows")
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True, default=str) + "\n" for r in rows)
    path = Path(tempfile.gettempdir()) / "arlopti_train_data" / f"{hashlib.sha1(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return str(path)


def build_overrides(overrides: Sequence[str] | None = None, reward_fn: Callable | str | Sequence | None = None,
                    reward_weights: Sequence[float] | None = None, train_data: Any = None,
                    env: type | str | None = None) -> list[str]:
    """The Hydra overrides :func:`run` composes with: ``overrides`` then what the keywords add
    (module docstring); a group the caller already chose (``task=``, ``data=``) is kept."""
    from arlopti.config.compose import quoted

    out = [str(o) for o in (overrides or [])]
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in out if "=" in o}
    added = _reward_overrides(reward_fn, reward_weights, chosen)
    if env is not None:
        from arlopti.tasks.env.loading import register_env

        added.append(f"task.env={quoted(env if isinstance(env, str) else register_env(env))}")
    if train_data is not None:
        if "data" not in chosen:
            added.append("data=prompts")
        added.append(f"data.train_file={quoted(data_file(train_data))}")
    return out + [o for o in added if o.split("=", 1)[0] not in chosen or "." in o.split("=", 1)[0]]


def _result(out: dict, run_dir: Path) -> RunResult:
    from arlopti.entry.cluster import stopped_by

    module = out.get("module")
    ctx = getattr(module, "last_step_context", None)
    metrics = {k: float(v) for k, v in (getattr(ctx, "metrics", None) or {}).items()}
    evals = getattr(module, "eval_results", None) or []
    ckpt = out.get("ckpt_path") or (run_dir / "checkpoints" / "last.ckpt")
    ckpt = Path(ckpt) if ckpt and Path(ckpt).exists() else None
    return RunResult(run_dir=run_dir, metrics=metrics, checkpoint=ckpt, summary=out.get("summary") or {},
                     eval_results=dict(evals[-1]) if evals else {}, objective=out.get("objective"),
                     interrupted=stopped_by(module))


def run(overrides: Sequence[str] | None = None, *, reward_fn: Callable | str | Sequence | None = None,
        reward_weights: Sequence[float] | None = None, train_data: Any = None,
        env: type | str | None = None) -> RunResult:
    """Train as ``python train.py <overrides>`` would, plus what the keywords add (module
    docstring), and return a :class:`RunResult`. Errors are raised as they are, with their own
    message and no report of Hydra's (a bad override as :class:`arlopti.config.ConfigError`, a
    failing reward as :class:`arlopti.tasks.custom.RewardFailureError`); the traceback is also in
    the run's ``train.log``. Ctrl-C finishes the step, saves the checkpoint and raises
    :class:`RunInterrupted` (a ``KeyboardInterrupt``); another signal (SIGTERM) returns the result
    with ``interrupted`` set."""
    from hydra.core.hydra_config import HydraConfig

    from arlopti.config import check_overrides
    from arlopti.config.compose import prepare, run_job
    from arlopti.entry.cli import check_composes, translate_output_dir
    from arlopti.entry.failures import record_traceback
    from arlopti.tasks.custom import reset_shown_tracebacks

    prepare()  # the checkout's configs/ (or $PROJECT_ROOT's), before any override is read
    # TRL's output_dir= is paths.log_dir=; a misspelt key is one ConfigError line with the closest key
    all_overrides = translate_output_dir(build_overrides(overrides, reward_fn, reward_weights, train_data, env))
    check_overrides(all_overrides)
    check_composes(all_overrides)
    reset_shown_tracebacks()
    box: dict[str, Any] = {}

    def task_function(cfg):
        from arlopti.entry.train import train

        box["run_dir"] = Path(HydraConfig.get().runtime.output_dir)
        try:
            box["out"] = train(cfg)
        except Exception as err:  # noqa: BLE001 - raised below, after the job: Hydra would report it first
            record_traceback(err)
            box["error"] = err

    run_job(task_function, all_overrides)
    if "error" in box:
        raise box["error"]
    result = _result(box["out"], box["run_dir"])
    if result.interrupted == "SIGINT":
        raise RunInterrupted(f"Ctrl-C: arlopti.run stopped after rollout step "
                             f"{result.summary.get('rollout_steps', '?')}; checkpoint {result.checkpoint} "
                             "(resume: the same overrides plus ckpt_path=<it>)", result)
    return result
