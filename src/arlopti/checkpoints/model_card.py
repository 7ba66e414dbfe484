"""The model card ``arlopti export`` writes beside the weights: ``README.md``, built and parsed by
``huggingface_hub.ModelCard`` / ``ModelCardData`` (the validation results as ``EvalResult``, which the
Hub reads as ``model-index``), so the YAML is the Hub's own.

Issue 54: the card says what was rewarded (the task, its reward functions or reward model and their
weights, from the run's ``.hydra/config.yaml``; :func:`reward_lines`), lists only the settings in force
(a method that is off is left out; :func:`settings_in_force`), rounds its numbers to 4 significant
digits, names the framework versions, starts its use with a quick-start snippet and holds no absolute
path (a data file is named by its file name).

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
model, ``smollm2-135m-instruct`` and local folders are not, and the body names them instead),
``library_name`` (``transformers``; ``peft`` for an adapter folder), ``pipeline_tag``, ``tags``
(``arlopti``, the advantage estimator, ``ar`` / ``lopti`` as configured, a token method,
``reinforcement-learning``), ``datasets`` (only a training source given as ``hub:NAME``; a local file
or our generator has no hub id and the body names it) and ``model-index`` with the last
validation **of these weights** (``eval_last`` at the checkpoint's rollout step; per validation set,
one metric per sampling mode and metric). A run without a validation, without ``summary.json`` or
whose last validation is of another step gets no ``model-index`` and a sentence saying which.
Validation sets are arlopti's own (no hub id): their ``dataset.type`` is ``arlopti:<task>/<set>``,
which cannot be read as a hub id. The body: a quick start, what was rewarded, the settings in force,
the evaluation, the framework versions and the paper's BibTeX (:data:`BIBTEX`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    """One line naming what the run trained on, from its data identity (``hyper_parameters.data``):
    ``data.<key>`` = value pairs, a file by its name only (no machine's path), every run of white
    space as one space (a system prompt has newlines)."""
    if not data:
        return "not recorded in the checkpoint (hyper_parameters.data is absent)"
    target = str(data.get("_target_", "")).rsplit(".", 1)[-1] or "a data module"
    rest = ", ".join(f"`data.{k}` = {_plain(v)}" for k, v in data.items() if k != "_target_")
    return " ".join(f"{target}: {rest}".split())


def _plain(v: Any) -> str:
    """A data setting as the card shows it: a path by its file name, a list as JSON, the rest as text."""
    if isinstance(v, str) and (v.startswith(("/", "~")) or "/" in v and Path(v).suffix):
        return Path(v).name
    return json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)


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


def eval_results(evaluation: dict) -> list:
    """``huggingface_hub.EvalResult`` per validation set and (mode, metric), in the order the run logged
    them (``val/<task>/mean/...`` are in the body only)."""
    from huggingface_hub import EvalResult

    out = []
    for key, value in evaluation.items():
        parts = split_val_key(key)
        if parts is None or parts[1] == "mean":
            continue
        task, vset, mode, metric = parts
        out.append(EvalResult(task_type="text-generation", task_name="Text Generation",
                              dataset_type=f"arlopti:{task}/{vset}", dataset_name=f"{vset} ({task} validation set)",
                              dataset_split="validation", metric_type=METRIC_TYPES.get(metric, metric),
                              metric_value=rounded(float(value)), metric_name=f"{mode} {metric}"))
    return out


def card_data(run: dict, data: dict, name: str, evaluation: dict, adapter: bool):
    """The card's ``ModelCardData``: base model and datasets only where they are hub ids."""
    from huggingface_hub import ModelCardData

    base, datasets = hub_model_id((run.get("model") or {}).get("name_or_path")), hub_datasets(data)
    results = eval_results(evaluation)
    return ModelCardData(base_model=base, library_name="peft" if adapter else "transformers",
                         pipeline_tag="text-generation", tags=method_tags(run), datasets=datasets or None,
                         model_name=name if results else None, eval_results=results or None)


def front_matter(run: dict, data: dict, name: str, evaluation: dict, adapter: bool) -> str:
    """The YAML front matter (without the ``---`` lines), as ``ModelCardData`` writes it."""
    return card_data(run, data, name, evaluation, adapter).to_yaml()


def provenance_lines(run: dict, data: dict) -> list[str]:
    """Where the base model and the data came from, said in the body when they have no hub id."""
    model = (run.get("model") or {}).get("name_or_path")
    lines = [] if hub_model_id(model) else [f"- base model: `{_plain(model)}` (not a hub id)"]
    return lines + [f"- data: {data_description(data)}"]


def flatten(d: dict, prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"<prefix>.a.b": 1}`` (lists and tuples kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}"
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def rounded(v: Any) -> Any:
    """Numbers to 4 significant digits (lists too); anything else as it is."""
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, (list, tuple)):
        return [rounded(x) for x in v]
    return v


def _value(v: Any) -> str:
    """A value in the card: its JSON, rounded (:func:`rounded`), so that the card reads back as numbers."""
    return "`" + json.dumps(rounded(v)) + "`"


def _uses(param: str, method: str) -> bool:
    """Whether a ``loss_params`` / ``token_method`` setting belongs to ``method`` (its name's first part
    is one of the method's: ``sapo_tau_pos`` -> sapo, ``cov_ratio`` -> clip_cov and kl_cov)."""
    return param.split("_")[0] in method.split("_")


def correction_in_force(run: dict) -> str:
    """The rollout correction the run applied (``auto`` resolved by the config's own rule)."""
    from arlopti.config import RolloutConfig, RolloutCorrectionConfig
    from arlopti.config.check import saved_run_as_current
    from arlopti.config.rules import effective_correction_mode

    saved = (run.get("algorithm") or {}).get("rollout_correction") or {}
    correction = from_dict(RolloutCorrectionConfig, saved_run_as_current(saved, RolloutCorrectionConfig,
                                                                         "algorithm.rollout_correction"), "")
    rollout = from_dict(RolloutConfig, saved_run_as_current(run.get("rollout") or {}, RolloutConfig, "rollout"), "")
    return effective_correction_mode(rollout, correction)


def _correction_uses(name: str, mode: str) -> bool:
    return name == "mode" or (name == "cap" and mode in ("tis", "seq_tis")) or (name.startswith("mis_") and mode == "mis")


def _algorithm_in_force(algo: dict, correction: str = "none") -> dict[str, Any]:
    """``algorithm.*`` without the methods that are off (AR at alpha 0, Lopti disabled, no token method,
    DAPO's parts off, no KL, no rollout correction: ``correction`` is the mode in force) and without
    other methods' parameters."""
    flat = flatten(algo, "algorithm")
    off = {"algorithm.ar_alpha": not algo.get("ar_alpha"), "algorithm.dual_clip": algo.get("dual_clip") is None,
           "algorithm.entropy_coef": not algo.get("entropy_coef"),
           "algorithm.otb_zero_tail": "otb" not in str(algo.get("advantage"))}
    kl_off = not algo.get("kl_coef")
    dapo = algo.get("dapo") or {}
    token = str((algo.get("token_method") or {}).get("name", "none"))
    keep = {}
    for key, value in flat.items():
        parts = key.split(".")
        if off.get(key) or (kl_off and parts[1].startswith("kl_")):
            continue
        if parts[1] == "lopti" and not (algo.get("lopti") or {}).get("enabled"):
            continue
        if parts[1] == "token_method" and (token == "none" or parts[2] != "name" and not _uses(parts[2], token)):
            continue
        if parts[1] == "loss_params" and not _uses(parts[2], str(algo.get("policy_loss"))):
            continue
        if parts[1] == "rollout_correction" and (correction == "none" or not _correction_uses(parts[2], correction)):
            continue
        if parts[1] == "dapo" and not _dapo_in_force(parts[2], dapo):
            continue
        keep[key] = correction if key == "algorithm.rollout_correction.mode" else value
    return keep


def _dapo_in_force(name: str, dapo: dict) -> bool:
    if name in ("dynamic_sampling", "max_gen_batches"):
        return bool(dapo.get("dynamic_sampling"))
    if name in ("overlong_buffer", "overlong_penalty"):
        return bool(dapo.get("overlong_buffer"))
    return bool(dapo.get(name))


#: The training settings shown beside the algorithm's.
TRAINING_KEYS = ("optim.name", "optim.lr", "optim.lr_schedule", "optim.warmup_steps", "optim.grad_clip",
                 "sizes.prompts_per_step", "sizes.group_size", "sizes.mini_batch_size", "rollout.temperature",
                 "rollout.top_p", "rollout.max_new_tokens", "model.dtype", "model.lora.r")


def settings_in_force(run: dict) -> dict[str, Any]:
    """The algorithm's settings in force (:func:`_algorithm_in_force`), then :data:`TRAINING_KEYS` (LoRA's
    rank only when LoRA is on, warm-up only when it has steps)."""
    flat = {k: v for part in ("optim", "sizes", "rollout", "model") for k, v in flatten(run.get(part) or {}, part).items()}
    training = {k: flat[k] for k in TRAINING_KEYS if k in flat}
    for key in ("model.lora.r", "optim.warmup_steps"):
        if not training.get(key):
            training.pop(key, None)
    return {**_algorithm_in_force(run.get("algorithm") or {}, correction_in_force(run)), **training}


def settings_table(run: dict) -> list[str]:
    """``| setting | value |`` rows of :func:`settings_in_force`."""
    rows = settings_in_force(run)
    return ["| setting | value |", "| --- | --- |", *(f"| `{k}` | {_value(v)} |" for k, v in rows.items())]


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


def run_config_file(ckpt: Path) -> dict | None:
    """The run's composed config as Hydra saved it (``<run>/.hydra/config.yaml``), or None."""
    import yaml

    run = run_dir_of(ckpt)
    path = run / ".hydra" / "config.yaml" if run is not None else None
    if path is None or not path.is_file():
        return None
    return yaml.safe_load(path.read_text()) or {}


def reward_lines(config: dict | None, data: dict) -> list[str]:
    """What the policy was rewarded for: ``task=custom``'s functions and reward model with their weights,
    else the built-in task that scores the data (its ``tasks.<task>`` options), and an environment."""
    if config is None:
        return ["Not recorded: the run's `.hydra/config.yaml` is not beside the checkpoint."]
    task = config.get("task") or {}
    entries = [str(f) for f in (task.get("reward_fns") or ([task["reward_fn"]] if task.get("reward_fn") else []))]
    models = task.get("reward_model") or []
    entries += [f"reward model `{_plain(str(m))}`" for m in ([models] if isinstance(models, str) else models)]
    lines = []
    if entries:
        weights = list(task.get("reward_weights") or [])
        weights += [1.0] * (len(entries) - len(weights))  # null weights: all 1.0 (the config checks the count)
        lines.append("- task: `custom`, the weighted sum of:")
        lines += [f"  - {e if e.startswith('reward model') else f'`{e}`'}, weight {rounded(float(w))}"
                  for e, w in zip(entries, weights)]
    else:
        name = str((config.get("data") or {}).get("task") or data.get("task") or _task_of(data))
        options = (config.get("tasks") or {}).get(name) or {}
        shown = ", ".join(f"`tasks.{name}.{k}` = {_plain(v)}" for k, v in options.items()) if isinstance(options, dict) else ""
        lines.append(f"- task: `{name}`, its built-in reward" + (f" ({shown})" if shown else ""))
    if task.get("env"):
        lines.append(f"- environment: `{_plain(str(task['env']))}` (multi-turn; its reward is added)")
    return lines


def _task_of(data: dict) -> str:
    target = str(data.get("_target_", "")).lower()
    return "kk" if "kk" in target else "math" if "math" in target else "unknown"


#: The packages named under "Framework versions" (their installed versions at export).
FRAMEWORKS = ("arlopti", "torch", "transformers", "lightning", "tokenizers", "huggingface_hub")


def framework_lines(adapter: bool) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    lines = []
    for name in FRAMEWORKS + (("peft",) if adapter else ()):
        try:
            lines.append(f"- {name}: {dist_version(name)}")
        except PackageNotFoundError:
            lines.append(f"- {name}: (not installed)")
    return lines


def card_text(meta: dict, ckpt: Path, name: str, adapter: bool, repo_id: str | None = None) -> str:
    """The whole card of checkpoint ``ckpt`` (its non-tensor part ``meta``) exported as ``name``
    (``repo_id``: the hub repo it is pushed to, which the quick start loads)."""
    return build_card(meta, ckpt, name, adapter, repo_id).content


def build_card(meta: dict, ckpt: Path, name: str, adapter: bool, repo_id: str | None = None):
    """The ``huggingface_hub.ModelCard`` of :func:`card_text` (its YAML parsed back by the Hub's own class)."""
    from huggingface_hub import ModelCard

    hp = meta.get("hyper_parameters") or {}
    run, data = hp.get("run") or {}, hp.get("data") or {}
    step = (meta.get("arlopti") or {}).get("rollout_step")
    summary = read_summary(run_dir_of(ckpt))
    evaluation, why = evaluation_of(summary, step)
    algo = algorithm_of(run)
    model = (run.get("model") or {}).get("name_or_path")
    kind = "This is a LoRA adapter (PEFT) for" if adapter else "This model is a fine-tune of"
    methods = [m for m, on in ((f"AR (alpha {rounded(algo.ar_alpha)})", algo.ar_alpha > 0),
                               (f"Lopti (eta {rounded(algo.lopti.eta)})", algo.lopti.enabled)) if on]
    body = [
        f"# {name}", "",
        f"{kind} `{_plain(model)}` trained with reinforcement learning by {PROJECT} {version()}, which "
        f"reproduces *Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs* ([arXiv 2505.12929]({PAPER_URL})): "
        f"method `{algo.label}` (advantage estimator `{algo.advantage}`, policy loss `{algo.policy_loss}` with "
        f"`{algo.loss_agg}` aggregation" + (", " + ", ".join(methods) if methods else "") + ").", "",
        "## Quick start", "", *quick_start(repo_id or name, adapter), "",
        "## What was rewarded", "", *reward_lines(run_config_file(ckpt), data), "",
        "## Training", "",
        f"- checkpoint: `{ckpt.name}` at rollout step {step}, {meta.get('global_step')} optimizer steps",
        *provenance_lines(run, data), "",
        "The settings in force (methods that are off are left out; numbers to 4 significant digits):", "",
        *settings_table(run), "",
        *training_lines(summary, step),
        "## Evaluation", "", why, "",
        *(evaluation_table(evaluation) + [""] if evaluation else []),
        "## Framework versions", "", *framework_lines(adapter), "",
        "## Citation", "", "```bibtex", BIBTEX, "```", ""]
    data_yaml = card_data(run, data, name, evaluation, adapter).to_yaml()
    return ModelCard("---\n" + data_yaml + "\n---\n\n" + "\n".join(body))


def version() -> str:
    """The installed arlopti's version (its package metadata), or ``(version unknown)``."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(PROJECT)
    except PackageNotFoundError:
        return "(version unknown)"


def quick_start(where: str, adapter: bool) -> list[str]:
    """The card's quick start (TRL's): a chat turn through ``pipeline``; ``where``: the hub repo the
    export is pushed to, else the export folder's name."""
    load = ([f'model = AutoPeftModelForCausalLM.from_pretrained("{where}")',
             f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
             'generator = pipeline("text-generation", model=model, tokenizer=tokenizer)']
            if adapter else [f'generator = pipeline("text-generation", model="{where}")'])
    imports = (["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer, pipeline"]
               if adapter else ["from transformers import pipeline"])
    return ["```python", *imports, "", *load,
            'messages = [{"role": "user", "content": "Who is a knight and who is a knave? ..."}]',
            'print(generator(messages, max_new_tokens=256, return_full_text=False)[0]["generated_text"])', "```"]

