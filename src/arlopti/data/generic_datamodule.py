"""``data=prompts``: prompts (and answers) from any table, for any registered task.

``GenericPromptDataModule`` reads a training source and, optionally, a validation source; each is

* a file: ``.jsonl`` / ``.jsonl.gz``, ``.json`` (a list of objects), ``.parquet`` or ``.csv``
  (header line; every value a string), read by :mod:`arlopti.prompts.readers`;
* a ``datasets`` folder (``save_to_disk`` output, ``datasets.load_from_disk``); a ``DatasetDict``
  names its split as ``FOLDER@split`` unless it holds one split;
* ``hub:NAME[:CONFIG][@SPLIT]`` (``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train")``;
  needs the network or the hub cache).

Validation: ``val_file`` (a source as above), or ``val_fraction`` f in (0, 1): ``max(1, round(f·n))``
of the training source's n rows, drawn with ``numpy.random.default_rng(split_seed)`` (independent
of the run's seed, so runs with different seeds validate on the same rows), leave the training
set; neither: no validation set. The validation set is named ``val_name`` (metrics
``val/<task>/<val_name>/greedy/...``).

Columns (``prompt_key``, ``answer_key``; a dotted name reaches into a nested column, e.g. verl's
``answer_key=reward_model.ground_truth``, :func:`column`): the prompt column holds either a string or a list of chat
messages (``[{"role": ..., "content": ...}, ...]``, e.g. a ``messages`` column:
``data.prompt_key=messages``). With ``chat_template=true`` (default) a string becomes one user
message and the messages are rendered by the tokenizer's chat template with the generation prompt;
with ``false`` the string is fed as it is (raw text; a messages column is then an error).
``system_prompt`` (optional) is a system message before the record's messages when they have none
(chat), or the text before the prompt followed by a blank line (raw). ``assistant_prefix`` is
appended after the rendered prompt (e.g. ``<think>``). ``answer_key`` is the ground truth column
(any JSON value, handed to the reward as read; ``null``: no answer, ground truth ``None``).

Records: ``uid = "<task>/<dataset>/<split>/<row index in its source>"``, ``task`` = ``data.task``
(default ``custom``: the reward of ``task=custom``; any registered task name works, e.g. ``math``),
``meta`` = every other column of the row plus ``dataset``, ``split`` (``train``/``val``) and
``index`` (these three win over columns of the same name).

Errors name the place: a missing column (``path:line: no column 'prompt' (data.prompt_key); the
record's columns: [...]``), a prompt of the wrong type, a bad line of the file. Prompts longer than
``max_prompt_length`` tokens (validation: ``val_max_prompt_length`` when set) are dropped, never
truncated, and counted (:class:`~arlopti.data.prompt_datamodule.PromptDataModule`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from arlopti.data.prompt_datamodule import PromptDataModule
from arlopti.prompts.records import PromptRecord
from arlopti.prompts.readers import iter_dataset_folder, iter_records

log = logging.getLogger(__name__)

HUB_PREFIX = "hub:"


def read_source(source: str, key: str = "data.train_file") -> list[tuple[str, dict[str, Any]]]:
    """``(location, row)`` of every row of ``source`` (a file, a datasets folder, ``FOLDER@split``
    or ``hub:NAME[:CONFIG][@SPLIT]``; module docstring). ``key`` names the setting in errors."""
    source = str(source)
    if source.startswith(HUB_PREFIX):
        return _read_hub(source[len(HUB_PREFIX):], key)
    path = Path(source)
    if path.exists():
        return list(iter_records(path))
    folder, at, split = source.rpartition("@")
    if at and Path(folder).is_dir():
        return list(iter_dataset_folder(folder, split))
    raise FileNotFoundError(f"{key}={source}: no such file or folder (a .jsonl/.json/.parquet/.csv file, a "
                            "datasets folder, FOLDER@split, or hub:NAME[:CONFIG][@SPLIT])")


def _read_hub(spec: str, key: str) -> list[tuple[str, dict[str, Any]]]:
    name, at, split = spec.partition("@")
    name, colon, config = name.partition(":")
    split = split or "train"
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{key}=hub:{spec} needs the `datasets` package (pip install datasets)") from None
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as err:  # noqa: BLE001 - offline, unknown name, unknown split ...
        raise ValueError(f"{key}=hub:{spec}: cannot load {name!r} (config {config or None}, split {split!r}) from "
                         f"the hub: {type(err).__name__}: {err}") from None
    where = f"hub:{name}" + (f":{config}" if config else "") + f"@{split}"
    return [(f"{where}[{i}]", dict(row)) for i, row in enumerate(ds)]


def column(row: dict, key: str, setting: str, where: str) -> Any:
    """``row[key]``, or for a dotted ``key`` (``reward_model.ground_truth``) the value reached through
    nested mappings (a column literally named ``key`` wins). A missing key is a ValueError naming
    ``where``, the key, the ``setting`` and the keys present where the walk stopped."""
    if key in row:
        return row[key]
    value, path = row, []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            here = f"the record's columns: {sorted(row)}" if not path else (
                f"{'.'.join(path)} holds " + (f"the keys {sorted(value)}" if isinstance(value, dict)
                                              else f"a {type(value).__name__}"))
            raise ValueError(f"{where}: no column {key!r} ({setting}); {here}")
        value = value[part]
        path.append(part)
    return value


def _dataset_name(source: str) -> str:
    """``data/my_task/train.jsonl`` -> ``my_task``; ``qa.csv`` -> ``qa``; ``hub:openai/gsm8k:main`` ->
    ``gsm8k``."""
    if source.startswith(HUB_PREFIX):
        return source[len(HUB_PREFIX):].split("@")[0].split(":")[0].rstrip("/").split("/")[-1]
    path = Path(source.split("@")[0])
    stem = path.name.split(".")[0]
    if stem in ("train", "data", "") and path.parent.name:
        return path.parent.name
    return stem


def split_indices(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train rows, validation rows)``, each ascending: ``max(1, round(fraction * n))`` rows drawn
    for validation with ``numpy.random.default_rng(seed).permutation(n)`` (its first ones)."""
    n_val = max(1, int(round(fraction * n)))
    if n_val >= n:
        raise ValueError(f"data.val_fraction={fraction} of {n} rows leaves no training row; use a smaller "
                         "fraction or data.val_file")
    perm = np.random.default_rng(seed).permutation(n)
    val = sorted(int(i) for i in perm[:n_val])
    chosen = set(val)
    return [i for i in range(n) if i not in chosen], val


class GenericPromptDataModule(PromptDataModule):
    """See the module docstring. Hydra-friendly plain arguments (``configs/data/prompts.yaml``)."""

    def __init__(self, tokenizer=None, prompts_per_step: int = 8, max_prompt_length: int = 1024,
                 seed: int = 42, shuffle: bool = True, num_workers: int = 0,
                 val_max_prompt_length: int | None = None, *, train_file: str | None = None,
                 val_file: str | None = None, val_fraction: float | None = None, split_seed: int = 0,
                 task: str = "custom", dataset_name: str | None = None, prompt_key: str = "prompt",
                 answer_key: str | None = "answer", system_prompt: str | None = None,
                 chat_template: bool = True, assistant_prefix: str = "", limit: int | None = None,
                 val_limit: int | None = None, val_name: str = "val"):
        super().__init__(tokenizer=tokenizer, prompts_per_step=prompts_per_step,
                         max_prompt_length=max_prompt_length, seed=seed, shuffle=shuffle,
                         num_workers=num_workers, val_max_prompt_length=val_max_prompt_length)
        if not train_file:
            raise ValueError("data=prompts needs data.train_file=FILE (.jsonl, .json, .parquet, .csv, a datasets "
                             "folder or hub:NAME); see docs/custom_task.md")
        if val_file and val_fraction is not None:
            raise ValueError(f"data.val_file={val_file} and data.val_fraction={val_fraction}: give one of them")
        if val_fraction is not None and (isinstance(val_fraction, bool) or not 0 < float(val_fraction) < 1):
            raise ValueError(f"data.val_fraction={val_fraction!r}: expected a number in (0, 1), or null")
        if not isinstance(prompt_key, str) or not prompt_key:
            raise ValueError(f"data.prompt_key={prompt_key!r}: expected a column name")
        if not isinstance(chat_template, bool):
            raise ValueError(f"data.chat_template={chat_template!r}: expected true or false")
        if not isinstance(task, str) or not task:
            raise ValueError(f"data.task={task!r}: expected a registered task name (custom, kk, math, ...)")
        for key, value in (("limit", limit), ("val_limit", val_limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"data.{key}={value!r}: expected an int >= 1, or null (all)")
        self.train_file = str(train_file)
        self.val_file = str(val_file) if val_file else None
        self.val_fraction = None if val_fraction is None else float(val_fraction)
        self.split_seed = int(split_seed)
        self.task_name = task
        self.dataset_name = dataset_name or _dataset_name(self.train_file)
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self.system_prompt = system_prompt
        self.chat_template = chat_template
        self.assistant_prefix = assistant_prefix or ""
        self.limit = limit
        self.val_limit = val_limit
        self.val_name = val_name
        self._rows: tuple[list, list] | None = None

    # ---- reading ------------------------------------------------------------------------------
    def _split_rows(self) -> tuple[list[tuple[int, str, dict]], list[tuple[int, str, dict]]]:
        """``(train, val)`` rows as ``(row index, location, row)``, read once."""
        if self._rows is None:
            read = read_source(self.train_file, "data.train_file")
            rows = [(i, where, rec) for i, (where, rec) in enumerate(read)]
            if not rows:
                raise ValueError(f"data.train_file={self.train_file} holds no rows")
            val: list = []
            if self.val_file:
                read = read_source(self.val_file, "data.val_file")
                val = [(i, where, rec) for i, (where, rec) in enumerate(read)]
                if not val:
                    raise ValueError(f"data.val_file={self.val_file} holds no rows")
            elif self.val_fraction is not None:
                train_idx, val_idx = split_indices(len(rows), self.val_fraction, self.split_seed)
                rows, val = [rows[i] for i in train_idx], [rows[i] for i in val_idx]
                log.info("data.val_fraction=%s: %d of %d rows of %s held out for validation (split_seed=%d)",
                         self.val_fraction, len(val), len(rows) + len(val), self.train_file, self.split_seed)
            self._rows = (rows, val)
        return self._rows

    def _messages(self, prompt: Any, where: str) -> list[dict] | str:
        key = f"column {self.prompt_key!r} (data.prompt_key)"
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, (list, tuple)) and prompt:
            for j, m in enumerate(prompt):
                if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str)):
                    raise ValueError(f"{where}: {key}, message {j}: expected {{'role': str, 'content': str}}, got "
                                     f"{m!r:.120}")
            return [{"role": m["role"], "content": m["content"]} for m in prompt]
        raise ValueError(f"{where}: {key} holds a {type(prompt).__name__} ({prompt!r:.80}); expected a string "
                         "or a non-empty list of chat messages [{'role': ..., 'content': ...}]")

    def to_record(self, index: int, where: str, row: dict, split: str) -> PromptRecord:
        """One row as a :class:`PromptRecord` (module docstring); errors name ``where``."""
        prompt = self._messages(column(row, self.prompt_key, "data.prompt_key", where), where)
        answer = (column(row, self.answer_key, "data.answer_key; null for none", where)
                  if self.answer_key is not None else None)
        meta = {k: v for k, v in row.items() if k not in (self.prompt_key, self.answer_key)}
        dataset = self.dataset_name if split == "train" or self.val_file is None else _dataset_name(self.val_file)
        meta.update(dataset=dataset, split=split, index=index)
        common = dict(uid=f"{self.task_name}/{dataset}/{split}/{index}", task=self.task_name,
                      ground_truth=answer,
                      assistant_prefix=self.assistant_prefix, meta=meta)
        if not self.chat_template:
            if not isinstance(prompt, str):
                raise ValueError(f"{where}: column {self.prompt_key!r} holds chat messages, which need "
                                 "data.chat_template=true")
            text = f"{self.system_prompt}\n\n{prompt}" if self.system_prompt else prompt
            return PromptRecord(text=text, **common)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return PromptRecord(messages=messages, **common)

    # ---- PromptDataModule -------------------------------------------------------------------
    def train_records(self) -> list[PromptRecord]:
        rows = self._split_rows()[0]
        rows = rows[:self.limit] if self.limit is not None else rows
        return [self.to_record(i, where, row, "train") for i, where, row in rows]

    def val_records(self) -> dict[str, list[PromptRecord]]:
        rows = self._split_rows()[1]
        if not rows:
            return {}
        rows = rows[:self.val_limit] if self.val_limit is not None else rows
        return {self.val_name: [self.to_record(i, where, row, "val") for i, where, row in rows]}
