"""``arlopti train --help`` and ``arlopti eval --help``: a page to read, not Hydra's 300-line config dump.

A usage line, two or three examples, where runs go (the output key), the reward keys of ``task=custom``
(read from ``configs/task/custom.yaml``), and the config groups the command's root config reads (its
``defaults`` list, each with the options in ``configs/<group>/``). Hydra's own page stays one flag away:
``--hydra-help``; the composed config: ``--cfg job``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

#: Per root config: the subcommand, what it does, and its examples (command, comment).
PAGES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "train.yaml": ("train", "train a policy with GRPO (+ AR / Lopti), configured by Hydra overrides", (
        ("arlopti train experiment=kk_lopti debug=smoke", "2 steps of a tiny model on CPU"),
        ("arlopti train task=custom task.reward_fn=rewards.py:score data=prompts data.train_file=train.jsonl",
         "your reward function on your prompts"),
        ("arlopti train experiment=kk_lopti paths.log_dir=runs", "runs/<task_name>/<run_name>/<time>/"),
    )),
    "eval.yaml": ("eval", "evaluate a model or a training checkpoint on a benchmark suite", (
        ("arlopti eval model=smollm2-135m-instruct eval=kk_suite", "a model on the K&K test sets"),
        ("arlopti eval ckpt_path=last train_task=kk_lopti eval=kk_suite", "the newest checkpoint of a run"),
        ("arlopti eval eval=val data=prompts data.val_file=val.jsonl task=custom task.reward_fn=rewards.py:score",
         "your validation set and reward"),
    )),
}

#: Groups left out of the page: Hydra's own settings (``--hydra-help``).
HIDDEN_GROUPS = ("hydra",)


def config_dir() -> Path:
    from arlopti.config.compose import default_config_dir

    return default_config_dir()


def defaults_groups(config_name: str) -> list[str]:
    """The config groups of ``config_name``'s ``defaults`` list, in its order (``optional`` dropped)."""
    root = yaml.safe_load((config_dir() / config_name).read_text()) or {}
    groups = []
    for entry in root.get("defaults") or []:
        if isinstance(entry, dict):
            name = next(iter(entry)).split()[-1]  # "optional local" -> local
            if name not in HIDDEN_GROUPS:
                groups.append(name)
    return groups


def group_options(group: str) -> list[str]:
    """The option files of ``configs/<group>/`` (a group registered only in code: its ``schema``; a folder
    of per-machine files none of which exists yet: ``(none yet)``)."""
    folder = config_dir() / group
    if not folder.is_dir():
        return ["schema"]
    return sorted(p.stem for p in folder.glob("*.yaml")) or ["(none yet)"]


def reward_keys() -> list[str]:
    """``task.reward_*`` of ``configs/task/custom.yaml``, the keys that say what is rewarded."""
    custom = yaml.safe_load((config_dir() / "task" / "custom.yaml").read_text()) or {}
    return [f"task.{k}" for k in custom if k.startswith("reward_") and not k.startswith("reward_model_")]


def _groups_block(config_name: str) -> list[str]:
    lines = []
    for group in defaults_groups(config_name):
        text = f"{group}: " + ", ".join(group_options(group))
        lines += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="      ")
    return lines


def script_help(config_name: str = "train.yaml") -> str:
    """The ``--help`` page of ``train.py`` (``arlopti train``) or ``eval.py`` (``arlopti eval``)."""
    from arlopti.config.run_dir import OUTPUT_ALIAS, OUTPUT_KEY

    sub, what, examples = PAGES[config_name]
    lines = [f"usage: arlopti {sub} [GROUP=OPTION ...] [KEY=VALUE ...] [-m/--multirun]", "", f"{what}.", "",
             "examples:", *(line for cmd, note in examples for line in (f"  # {note}", f"  {cmd}")), "",
             f"output: {OUTPUT_KEY}=DIR (TRL's {OUTPUT_ALIAS}=DIR means the same): each run writes",
             f"  DIR/<task_name>/<run_name>/<time>/; default: logs/ of the project you run from (the first folder",
             "  up from the working folder with .project-root or .git, else the working folder)",
             "rewards (task=custom, docs/custom_task.md): " + ", ".join(reward_keys()),
             *(["your own method (docs/plugins.md): plugins=[my_module] algorithm.policy_loss=<its name>"]
               if config_name == "train.yaml" else []), "",
             "groups (GROUP=OPTION; configs/<group>/<option>.yaml):", *_groups_block(config_name), "",
             f"more: arlopti {sub} --cfg job (the composed config), --hydra-help (Hydra's options), "
             "docs/config.md (every key)"]
    return "\n".join(lines)


__all__ = ["PAGES", "defaults_groups", "group_options", "reward_keys", "script_help"]
