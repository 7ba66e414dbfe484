"""What the learner writes to the loggers each rollout step (rank 0 only): the reduced scalars at
``rollout_step`` as the x-axis, and a few sample completions in each logger's native form
(:func:`write_samples`); and the run's config once (:func:`write_config`). Every tag is listed in
docs/metrics.md.

Sample completions per logger (``n_samples`` = ``log_completions``, the first responses of the step):

* TensorBoard: text ``samples/<i>`` (reward, the prompt's last 300 characters, the response);
* wandb: a Table ``samples`` per step, columns ``step, index, reward, prompt, response``;
* MLflow: an artifact ``samples/step_<step:06d>.jsonl``, one record per sample;
* CSV: ``samples.jsonl`` next to ``metrics.csv``, records appended each step.

A record: ``{"step", "index", "reward", "prompt"`` (the last 300 characters) ``, "response"}``. A
multi-turn episode's response is its whole transcript, the environment's parts between ``[[env]]`` and
``[[/env]]`` (:mod:`arlopti.rollout.turns`).
"""

from __future__ import annotations

import json
import os

from arlopti.learner.experience import Experience

#: Characters of the prompt's end kept with a sample.
PROMPT_TAIL = 300


def sample_records(experience: Experience, step: int, n_samples: int) -> list[dict]:
    """The first ``n_samples`` responses of ``experience`` as records (see the module docstring)."""
    out = []
    for i in range(min(n_samples, len(experience))):
        prompt = experience.prompt_texts[i][-PROMPT_TAIL:] if experience.prompt_texts else ""
        meta = experience.episode_metas[i] if experience.episode_metas else {}
        out.append({"step": int(step), "index": i, "reward": float(experience.rewards[i]), "prompt": prompt,
                    "response": meta.get("transcript", experience.response_texts[i])})
    return out


def logger_kind(logger) -> str:
    """``tensorboard`` / ``wandb`` / ``mlflow`` / ``csv`` / ``other`` by the names of the logger's
    classes, subclasses included (no import of the optional packages)."""
    kinds = {"TensorBoardLogger": "tensorboard", "WandbLogger": "wandb", "MLFlowLogger": "mlflow",
             "CSVLogger": "csv"}
    return next((kinds[c.__name__] for c in type(logger).__mro__ if c.__name__ in kinds), "other")


def _csv_dir(logger) -> str:
    """Where a CSVLogger writes metrics.csv (created if needed)."""
    path = logger.log_dir
    os.makedirs(path, exist_ok=True)
    return path


def write_samples(loggers, records: list[dict], step: int) -> None:
    """Each logger's native form of the sample records (see the module docstring)."""
    if not records:
        return
    for logger in loggers:
        kind = logger_kind(logger)
        if kind == "tensorboard":
            writer = logger.experiment
            for r in records:
                text = (f"**reward {r['reward']:.2f}**\n\n    ...{r['prompt']}\n\n    "
                        + r["response"].replace("\n", "\n    "))
                writer.add_text(f"samples/{r['index']}", text, step)
        elif kind == "wandb":
            cols = ["step", "index", "reward", "prompt", "response"]
            logger.log_table(key="samples", columns=cols, data=[[r[c] for c in cols] for r in records])
        elif kind == "mlflow":
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            logger.experiment.log_text(logger.run_id, text, f"samples/step_{step:06d}.jsonl")
        elif kind == "csv":
            with open(os.path.join(_csv_dir(logger), "samples.jsonl"), "a", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")


def write_step(loggers, metrics: dict[str, float], experience: Experience, step: int, n_samples: int) -> None:
    """The step's scalars to every logger, then its sample completions (:func:`write_samples`)."""
    for logger in loggers:
        logger.log_metrics(metrics, step=step)
    write_samples(loggers, sample_records(experience, step, n_samples), step)


def write_config(loggers, config_yaml: str) -> None:
    """The composed config (YAML text) in each logger's native form: TensorBoard text ``config``
    (step 0); wandb the file ``hydra_config.yaml`` in the run's files (wandb keeps its own ``config.yaml``
    there; the run's config itself is the
    hyper-parameters Lightning logs at the start); MLflow the artifact ``config.yaml``; CSV the
    file ``config.yaml`` next to ``metrics.csv`` (``hparams.yaml`` beside it holds the hyper-parameters)."""
    for logger in loggers:
        kind = logger_kind(logger)
        if kind == "tensorboard":
            logger.experiment.add_text("config", "    " + config_yaml.replace("\n", "\n    "), 0)
        elif kind == "wandb":
            run = logger.experiment
            path = os.path.join(run.dir, "hydra_config.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(config_yaml)
            run.save(path, base_path=run.dir, policy="now")
        elif kind == "mlflow":
            logger.experiment.log_text(logger.run_id, config_yaml, "config.yaml")
        elif kind == "csv":
            with open(os.path.join(_csv_dir(logger), "config.yaml"), "w", encoding="utf-8") as f:
                f.write(config_yaml)


# Final values shown beside the hyper-parameters in TensorBoard's HPARAMS tab (besides every val/*).
HPARAM_METRICS = ("reward/mean", "reward/accuracy", "update/kl", "update/entropy", "rollout/response_len_mean")


#: The attribute :class:`arlopti.callbacks.run_config.ConfigToLoggers` sets on each logger: the run's
#: ``{"seed", "task_name"}``.
IDENTITY_ATTR = "_arlopti_run_identity"


def hparams_first(config: dict, identity: dict | None = None) -> dict:
    """The columns that tell runs apart, first: ``algorithm`` (grpo / ar / lopti / ar_lopti),
    ``estimator``, ``loss`` (policy loss / aggregation), ``token_method``, ``alpha``, ``eta`` (0 without
    Lopti), then ``seed`` and ``task_name`` when known (``identity``); then the run config, flattened."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict, _sanitize_params

    algo = dict(config.get("algorithm") or {})
    lopti = dict(algo.get("lopti") or {})
    alpha = float(algo.get("ar_alpha") or 0.0)
    first = {"algorithm": "_".join((["ar"] if alpha > 0 else []) + (["lopti"] if lopti.get("enabled") else []))
             or "grpo",
             "estimator": algo.get("advantage"), "loss": f"{algo.get('policy_loss')} / {algo.get('loss_agg')}",
             "token_method": (algo.get("token_method") or {}).get("name"), "alpha": alpha,
             "eta": float(lopti.get("eta") or 0.0) if lopti.get("enabled") else 0.0}
    first.update({k: v for k, v in (identity or {}).items() if k in ("seed", "task_name")})
    first = {k: v for k, v in first.items() if v is not None}
    return {**first, **_sanitize_params(_flatten_dict(_convert_params(config)))}


def write_hparams(loggers, config: dict, last_metrics: dict[str, float], callback_metrics, step: int) -> None:
    """TensorBoard's HPARAMS tab: the run config beside its final metrics, the columns that tell
    runs apart first (:func:`hparams_first`).

    Only the hparams summary is written: the metric values shown are the last points of the
    scalar series of the same tags (``reward/mean``, ``val/...``), which the learner and the eval
    callback already logged, so no scalar is written twice. Other loggers get the config alone."""
    from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE

    final = {k: v for k, v in last_metrics.items() if k.startswith(HPARAM_METRICS)}
    final.update({k: float(v) for k, v in callback_metrics.items() if k.startswith("val/")})
    for logger in loggers:
        params = hparams_first(config, getattr(logger, IDENTITY_ATTR, None))
        writer = getattr(logger, "experiment", None)
        if _TENSORBOARD_AVAILABLE and hasattr(writer, "_get_file_writer"):
            from torch.utils.tensorboard.summary import hparams

            file_writer = writer._get_file_writer()
            for summary in hparams(params, final):
                file_writer.add_summary(summary, step)
        else:
            logger.log_hyperparams({**(getattr(logger, IDENTITY_ATTR, None) or {}), **config})
