"""The model card ``arlopti export`` writes beside the weights: ``README.md`` in the Hugging Face
Hub's model-card format (YAML front matter between ``---`` lines, then Markdown).

Everything in it comes from the checkpoint and the run's own files, never from a guess:

* the checkpoint (what :mod:`arlopti.checkpoints.export` and resume read): the run config it was
  trained with (``hyper_parameters.run``: ``algorithm``, ``optim``, ``sizes``, ``model``,
  ``rollout``), the data identity (``hyper_parameters.data``, :func:`arlopti.entry.train.data_signature`),
  its rollout step and optimizer steps;
* the run directory, when the checkpoint sits in one (``<run>/checkpoints/last.ckpt``, where the
  checkpoint callback writes it; :func:`run_dir_of`): ``summary.json``
  (:class:`arlopti.callbacks.summary.TrainingSummary`: the training rollouts' first and last steps and
  the validation results, ``eval_last``).

Front matter: ``base_model`` (``model.name_or_path`` when it is a hub id, ``owner/name``; the tiny
model, ``smollm2-135m-instruct`` and local folders are not, and get a comment instead),
``library_name`` (``transformers``; ``peft`` for an adapter folder), ``pipeline_tag``, ``tags``
(``arlopti``, the advantage estimator, ``ar`` / ``lopti`` as configured, a token method,
``reinforcement-learning``), ``datasets`` (only a training source given as ``hub:NAME``; a local file
or our generator has no hub id and gets a comment naming it) and ``model-index`` with the last
validation **of these weights** (``eval_last`` at the checkpoint's rollout step; per validation set,
one metric per sampling mode and metric). A run without a validation, without ``summary.json`` or
whose last validation is of another step gets no ``model-index`` and a sentence saying which.
Validation sets are arlopti's own (no hub id): their ``dataset.type`` is ``arlopti:<task>/<set>``,
which cannot be read as a hub id. The body restates the settings, the evaluation and the paper's
BibTeX (:data:`BIBTEX`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from arlopti.checkpoints.resume import CheckpointError
from arlopti.config import from_dict

CARD = "README.md"
PAPER_URL = "https://arxiv.org/abs/2505.12929"
PROJECT = "arlopti"
#: The training source form of ``data.train_file`` that names a hub dataset
#: (``arlopti.data.generic_datamodule.HUB_PREFIX``: ``hub:NAME[:CONFIG][@SPLIT]``).
HUB_PREFIX = "hub:"
BIBTEX = """@article{yang2025donotlet,
  title   = {Do Not Let Low-Probability Tokens Over-Dominate in {RL} for {LLMs}},
  author  = {Yang, Zhihe and Luo, Xufang and Wang, Zilong and Han, Dongqi and He, Zhiyuan and Li, Dongsheng and Xu, Yunjian},
  journal = {arXiv preprint arXiv:2505.12929},
  year    = {2025},
  url     = {https://arxiv.org/abs/2505.12929}
}"""
#: The validation metrics' ``model-index`` types (arlopti.eval.runner.metrics_of's names otherwise).
METRIC_TYPES = {"acc": "accuracy"}


def run_dir_of(ckpt: Path) -> Path | None:
    """The run directory of a checkpoint at ``<run>/checkpoints/<name>``, when it holds a run's files
    (``summary.json`` or Hydra's ``.hydra/config.yaml``); None for a checkpoint anywhere else."""
    parent = Path(ckpt).resolve().parent
    run = parent.parent
    if parent.name == "checkpoints" and ((run / "summary.json").is_file() or (run / ".hydra" / "config.yaml").is_file()):
        return run
    return None


def read_summary(run_dir: Path | None) -> dict | None:
    """``<run_dir>/summary.json`` (None when there is no run directory or no such file); a file that
    is not a JSON object is a :class:`CheckpointError` naming it."""
    path = run_dir / "summary.json" if run_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}): restore or delete it to export without its "
                              "evaluation") from None
    if not isinstance(summary, dict):
        raise CheckpointError(f"{path} holds a {type(summary).__name__}, not the run summary's object: restore or "
                              "delete it to export without its evaluation")
    return summary


def hub_model_id(name_or_path: str | None) -> str | None:
    """``name_or_path`` when it is a hub id (``owner/name``, no local folder of that name), else None
    (the rule of :func:`arlopti.models.loading.resolve_model_path`)."""
    if not name_or_path or name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") != 1:
        return None
    return None if Path(name_or_path).expanduser().exists() else name_or_path


def hub_datasets(data: dict) -> list[str]:
    """The hub dataset of the training source ``data.train_file = hub:NAME[:CONFIG][@SPLIT]``: [NAME]; else []."""
    source = str(data.get("train_file") or "")
    if not source.startswith(HUB_PREFIX):
        return []
    return [source[len(HUB_PREFIX):].partition("@")[0].partition(":")[0]]


def data_description(data: dict) -> str:
    """One line naming what the run trained on, from its data identity (``hyper_parameters.data``),
    every run of white space as one space."""
    if not data:
        return "not recorded in the checkpoint (hyper_parameters.data is absent)"
    target = str(data.get("_target_", "")).rsplit(".", 1)[-1] or "data module"
    rest = ", ".join(f"{k}={_flat(v)}" for k, v in data.items() if k != "_target_")
    return " ".join(f"{target}({rest})".split())  # one line: it is also a YAML comment (a system prompt has newlines)


def _flat(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def algorithm_of(run: dict):
    """The checkpoint's :class:`~arlopti.config.schema.AlgorithmConfig` (a saved older shape brought to
    today's by :func:`arlopti.config.check.saved_run_as_current`)."""
    from arlopti.config import AlgorithmConfig
    from arlopti.config.check import saved_run_as_current

    saved = saved_run_as_current(run.get("algorithm") or {}, AlgorithmConfig, "algorithm")
    return from_dict(AlgorithmConfig, saved, "algorithm")


def method_tags(run: dict) -> list[str]:
    """``arlopti``, the advantage estimator, ``ar`` / ``lopti`` when on (``AlgorithmConfig.label``), a
    token method, ``reinforcement-learning``."""
    algo = algorithm_of(run)
    parts = [] if algo.label == "grpo" else algo.label.split("_")  # "ar_lopti" -> ar, lopti
    token = algo.token_method.name
    tags = [PROJECT, algo.advantage, *parts, *([token] if token != "none" else []), "reinforcement-learning"]
    return list(dict.fromkeys(tags))


def evaluation_of(summary: dict | None, rollout_step: int | None) -> tuple[dict, str]:
    """``(eval_last, why)``: the run's last validation when it is of the checkpoint's rollout step, else
    ``{}`` and the sentence the card says instead."""
    if summary is None:
        return {}, "No evaluation: there is no `summary.json` of the run beside the checkpoint."
    last = summary.get("eval_last") or {}
    if not any(k.startswith("val/") for k in last):
        return {}, "No evaluation: the run wrote no validation results (`summary.json` has no `eval_last`)."
    if rollout_step is None or last.get("rollout_step") != rollout_step:
        return {}, (f"No evaluation of these weights: the run's last validation was at rollout step "
                    f"{last.get('rollout_step')}, this checkpoint is of rollout step {rollout_step}.")
    return last, (f"Validation at rollout step {rollout_step}, the checkpoint's (`summary.json`'s `eval_last`), on "
                  "arlopti's validation sets (`model-index` names them `arlopti:<task>/<set>`: they are not hub datasets).")


def split_val_key(key: str) -> tuple[str, str, str, str] | None:
    """``val/<task>/<set>/<mode>/<metric>`` -> (task, set, mode, metric); None for any other key."""
    parts = key.split("/")
    return tuple(parts[1:]) if len(parts) == 5 and parts[0] == "val" else None  # type: ignore[return-value]


def model_index(name: str, evaluation: dict) -> list[dict]:
    """``model-index`` of one model: a result per validation set (``val/<task>/mean/...`` are in the
    body only), a metric per (mode, metric) in the order the run logged them."""
    results: dict[tuple[str, str], list[dict]] = {}
    for key, value in evaluation.items():
        parts = split_val_key(key)
        if parts is None or parts[1] == "mean":
            continue
        task, vset, mode, metric = parts
        results.setdefault((task, vset), []).append(
            {"type": METRIC_TYPES.get(metric, metric), "value": float(value), "name": f"{mode} {metric}"})
    if not results:
        return []
    return [{"name": name, "results": [
        {"task": {"type": "text-generation", "name": "Text Generation"},
         "dataset": {"name": f"{vset} ({task} validation set)", "type": f"arlopti:{task}/{vset}", "split": "validation"},
         "metrics": metrics} for (task, vset), metrics in results.items()]}]


def front_matter(run: dict, data: dict, name: str, evaluation: dict, adapter: bool) -> str:
    """The YAML front matter (without the ``---`` lines); comments where a hub id is absent."""
    model = (run.get("model") or {}).get("name_or_path")
    base, datasets = hub_model_id(model), hub_datasets(data)
    meta: dict[str, Any] = {}
    if base:
        meta["base_model"] = base
    meta.update({"library_name": "peft" if adapter else "transformers", "pipeline_tag": "text-generation",
                 "tags": method_tags(run)})
    if datasets:
        meta["datasets"] = datasets
    index = model_index(name, evaluation)
    if index:
        meta["model-index"] = index
    notes = []
    if not base:
        notes.append(" ".join(f"# base_model: none: model.name_or_path={model} is not a hub id".split()))
    if not datasets:
        notes.append(f"# datasets: none: trained on {data_description(data)}, which has no hub id")
    return "\n".join(notes + [yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip()])


def flatten(d: dict, prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"<prefix>.a.b": 1}`` (lists and tuples kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}"
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def _value(v: Any) -> str:
    """A setting's value in the card: its JSON, so that the card can be read back exactly."""
    return "`" + json.dumps(list(v) if isinstance(v, tuple) else v) + "`"


#: The training settings shown beside the algorithm's (all of ``algorithm.*`` is shown).
TRAINING_KEYS = ("optim.name", "optim.lr", "optim.lr_schedule", "optim.warmup_steps", "optim.grad_clip",
                 "sizes.prompts_per_step", "sizes.group_size", "sizes.mini_batch_size", "rollout.temperature",
                 "rollout.top_p", "rollout.max_new_tokens", "model.dtype", "model.lora.r")


def settings_table(run: dict) -> list[str]:
    """``| setting | value |`` rows: every ``algorithm.*`` setting, then :data:`TRAINING_KEYS`."""
    flat = {k: v for part in ("algorithm", "optim", "sizes", "rollout", "model")
            for k, v in flatten(run.get(part) or {}, part).items()}
    keys = [k for k in flat if k.startswith("algorithm.")] + [k for k in TRAINING_KEYS if k in flat]
    return ["| setting | value |", "| --- | --- |", *(f"| `{k}` | {_value(flat[k])} |" for k in keys)]


def evaluation_table(evaluation: dict) -> list[str]:
    """``| metric | value |`` rows of every validation number (per set and the means over sets)."""
    rows = [(k, v) for k, v in evaluation.items() if k.startswith("val/")]
    return ["| metric | value |", "| --- | --- |", *(f"| `{k}` | {_value(v)} |" for k, v in rows)]


def training_lines(summary: dict | None, rollout_step: int | None) -> list[str]:
    """The training rollouts' reward, accuracy and format at the run's first and last steps (``summary.json``)."""
    if summary is None or summary.get("rollout_steps") != rollout_step:
        return []
    start, end = summary.get("start") or {}, summary.get("end") or {}
    keys = [k for k in ("reward/mean", "reward/accuracy", "reward/format_ok") if k in start or k in end]
    if not keys:
        return []
    return ["Training rollouts (sampled, not a validation), first and last steps of the run (`summary.json`):", "",
            "| metric | first | last |", "| --- | --- | --- |",
            *(f"| `{k}` | {_value(start.get(k))} | {_value(end.get(k))} |" for k in keys), ""]


def card_text(meta: dict, ckpt: Path, name: str, adapter: bool) -> str:
    """The whole card of checkpoint ``ckpt`` (its non-tensor part ``meta``) exported as ``name``."""
    hp = meta.get("hyper_parameters") or {}
    run, data = hp.get("run") or {}, hp.get("data") or {}
    step = (meta.get("arlopti") or {}).get("rollout_step")
    summary = read_summary(run_dir_of(ckpt))
    evaluation, why = evaluation_of(summary, step)
    algo = algorithm_of(run)
    model = (run.get("model") or {}).get("name_or_path")
    kind = "This is a LoRA adapter (PEFT) for" if adapter else "This model is a fine-tune of"
    lines = [
        "---", front_matter(run, data, name, evaluation, adapter), "---", "", f"# {name}", "",
        f"{kind} `{model}` trained with reinforcement learning by {PROJECT} {version()}, which "
        f"reproduces *Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs* ([arXiv 2505.12929]({PAPER_URL})): "
        f"method `{algo.label}` (advantage estimator `{algo.advantage}`, policy loss `{algo.policy_loss}` with "
        f"`{algo.loss_agg}` aggregation, AR alpha `{algo.ar_alpha}` (0: off), Lopti "
        f"{f'eta `{algo.lopti.eta}`' if algo.lopti.enabled else 'off'}).", "",
        "## Training", "",
        f"- checkpoint: `{ckpt.name}` at rollout step {step}, {meta.get('global_step')} optimizer steps",
        f"- data: {data_description(data)}", "",
        "<details><summary>The run's settings as saved in the checkpoint (<code>hyper_parameters.run</code>): every "
        "<code>algorithm.*</code> setting, then the main training settings</summary>", "", *settings_table(run), "",
        "</details>", "",
        *training_lines(summary, step),
        "## Evaluation", "", why, "",
        *(evaluation_table(evaluation) + [""] if evaluation else []),
        "## Use", "", *usage(adapter), "",
        "## Citation", "", "```bibtex", BIBTEX, "```", ""]
    return "\n".join(lines)


def version() -> str:
    """The installed arlopti's version (its package metadata), or ``(version unknown)``."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(PROJECT)
    except PackageNotFoundError:
        return "(version unknown)"


def usage(adapter: bool) -> list[str]:
    """The card's loading snippet (``<this folder>``: the export's folder, or its hub repo once uploaded)."""
    if adapter:
        return ["```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "",
                'model = AutoPeftModelForCausalLM.from_pretrained("<this folder>")',
                'tokenizer = AutoTokenizer.from_pretrained("<this folder>")', "```"]
    return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this folder>")', "```"]

