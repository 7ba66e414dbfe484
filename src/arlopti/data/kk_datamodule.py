"""``KKDataModule``: Knights-and-Knaves prompts for GRPO training and per-N validation.

Sources (``source``):

``official``
    ``data_dir`` is a folder in the shared fixture layout (``kk_train_34567ppl.jsonl.gz`` +
    ``kk_test_{N}ppl.jsonl``) or a ``prepare kk`` output (``train.jsonl`` + ``test_{N}ppl.jsonl``).
    Train: the train file's puzzles with N in ``train_people`` (all N when None), the first
    ``train_count_per_n`` per N (all when None). Validation: ``test_{N}ppl`` for N in
    ``val_people`` (every test file found when None), the first ``val_count_per_n`` each.
``files``
    Explicit ``train_file`` and ``val_files`` (``{set name: file}``); ``train_people`` and
    ``train_count_per_n`` filter the train file as above, ``val_count_per_n`` cuts each val set.
``generated``
    Our generator (offline), seed ``generator_seed`` for every N: per N, train = stream positions
    ``[100, 100+train_count_per_n)``, validation = the next ``val_count_per_n`` positions
    (defaults 900 / 100 give the Logic-RL logical puzzles; see :mod:`arlopti.tasks.kk.sources`).

Prompt (``template``, see :mod:`arlopti.tasks.kk.prompts`):

``official`` (``configs/data/kk.yaml``, so every ``kk_*`` experiment)
    Each record's own ``prompt`` field, fed byte for byte as the official runs do: the string
    already holds the Qwen chat markup and ends in ``<think>``; no chat template is applied and no
    special token is added (``PromptRecord(text=prompt)``, tokenised with
    ``add_special_tokens=False``). Every record read must carry it: a record without it raises
    ``ValueError`` naming ``file:line``, its record index and the fix; the ``generated`` source
    (no official prompts) is refused at construction.
``qwen-instruct`` (the constructor default; ``configs/data/kk_generated.yaml``)
    Our wording of the instructions as chat messages, rendered by the tokenizer's chat template,
    plus ``<think>``.
``base``
    Our wording as one plain completion text ending in ``Assistant: <think>``.

``python -m arlopti.data.preview data=kk ...`` writes exactly the prompts and token ids fed.

Validation sets are named ``kk_{N}ppl`` (``files``: the ``val_files`` keys). Each record has
``uid = "kk/<split>/<N>ppl/<index>"``, ``task = "kk"``, ``ground_truth = solution_text_format`` and
``meta = {"n_people", "split" ("train"/"test"), "index"}``. Shuffling, sharding, resumption and
the length filter (``max_prompt_length``; validation: ``val_max_prompt_length`` when set, which
``fidelity=official`` sets to 1,024) come from :class:`PromptDataModule`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

from arlopti.data.prompt_datamodule import PromptDataModule
from arlopti.prompts.records import PromptRecord
from arlopti.tasks.kk.generator import OFFICIAL_SEED, check_num_people
from arlopti.tasks.kk.prompts import OFFICIAL, TEMPLATES, build_prompt
from arlopti.tasks.kk.puzzle import Puzzle
from arlopti.tasks.kk.sources import (LOGIC_RL_TEST, LOGIC_RL_TRAIN, OFFICIAL_SKIP, by_num_people,
                                      find_layout, generated_split, read_puzzles, require_file)

log = logging.getLogger(__name__)

SOURCES = ("official", "files", "generated")
DEFAULT_PEOPLE = (3, 4, 5, 6, 7)


def _people(value, what: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        value = [value]
    try:
        return sorted({check_num_people(int(n)) for n in value})
    except (TypeError, ValueError) as err:
        raise ValueError(f"data.{what}={value!r}: {err}") from None


class KKDataModule(PromptDataModule):
    """See the module docstring. All arguments are Hydra-friendly plain values."""

    task_name = "kk"

    def __init__(self, tokenizer=None, prompts_per_step: int = 8, max_prompt_length: int = 400,
                 seed: int = 42, shuffle: bool = True, num_workers: int = 0, *,
                 source: str = "generated", data_dir: str | None = None, train_file: str | None = None,
                 val_files: Mapping[str, str] | None = None,
                 train_people: Sequence[int] | None = None, train_count_per_n: int | None = None,
                 val_people: Sequence[int] | None = None, val_count_per_n: int | None = None,
                 template: str = "qwen-instruct", generator_seed: int = OFFICIAL_SEED,
                 verify_solutions: bool = True, val_max_prompt_length: int | None = None):
        super().__init__(tokenizer=tokenizer, prompts_per_step=prompts_per_step,
                         max_prompt_length=max_prompt_length, seed=seed, shuffle=shuffle,
                         num_workers=num_workers, val_max_prompt_length=val_max_prompt_length)
        if source not in SOURCES:
            raise ValueError(f"data.source={source!r}: known sources are {list(SOURCES)}")
        if template not in TEMPLATES:
            raise ValueError(f"data.template={template!r}: known templates are {list(TEMPLATES)}")
        for name, count in (("train_count_per_n", train_count_per_n), ("val_count_per_n", val_count_per_n)):
            if count is not None and count < 0:
                raise ValueError(f"data.{name}={count}: must be >= 0 or null (all)")
        if template == OFFICIAL and source == "generated":
            raise ValueError("data.template=official feeds each record's own official 'prompt' field, and "
                             "data.source=generated puzzles have none; use data.template=qwen-instruct (as "
                             "configs/data/kk_generated.yaml does), or data.source=official/files with "
                             "records that carry the 'prompt' field (the shared fixtures fixtures/kk)")
        if source == "official" and data_dir is None:
            raise ValueError("data.source=official needs data.data_dir (a folder of K&K jsonl files)")
        if source == "files" and train_file is None and not val_files:
            raise ValueError("data.source=files needs data.train_file and/or data.val_files")
        self.source = source
        self.data_dir = data_dir
        self.train_file = train_file
        self.val_files = dict(val_files or {})
        self.train_people = _people(train_people, "train_people")
        self.val_people = _people(val_people, "val_people")
        self.train_count_per_n = train_count_per_n
        self.val_count_per_n = val_count_per_n
        self.template = template
        self.generator_seed = generator_seed
        self.verify_solutions = verify_solutions
        self._generated: dict[int, tuple[list[Puzzle], list[Puzzle]]] | None = None

    # ---- puzzles ----------------------------------------------------------------------------
    def train_puzzles(self) -> list[Puzzle]:
        """Train puzzles, per N ascending, each N in file (or stream) order."""
        if self.source == "generated":
            people = self.train_people if self.train_people is not None else list(DEFAULT_PEOPLE)
            return [p for n in people for p in self._generated_split(n)[0]]
        if self.source == "official":
            path = find_layout(self.data_dir).train_file
            path = require_file(path if path is not None else Path(self.data_dir) / "train.jsonl", "train")
        else:
            if self.train_file is None:
                return []
            path = require_file(self.train_file, "train")
        groups = by_num_people(self._read(path))
        if self.train_people is not None:
            missing = [n for n in self.train_people if n not in groups]
            if missing:
                raise ValueError(f"{path}: no puzzles with N={missing} people (data.train_people); "
                                 f"the file has N={sorted(groups)}")
            groups = {n: groups[n] for n in self.train_people}
        return [p for ps in groups.values() for p in self._cut(ps, self.train_count_per_n, f"{path}")]

    def val_puzzles(self) -> dict[str, list[Puzzle]]:
        """Validation puzzles by set name (``kk_{N}ppl``, or the ``val_files`` keys)."""
        if self.source == "generated":
            people = self.val_people if self.val_people is not None else list(DEFAULT_PEOPLE)
            return {f"kk_{n}ppl": self._generated_split(n)[1] for n in people}
        if self.source == "files":
            return {name: self._val_set(name, self._read(require_file(f, f"validation set {name!r}")), f)
                    for name, f in self.val_files.items()}
        layout = find_layout(self.data_dir)
        people = self.val_people if self.val_people is not None else sorted(layout.test_files)
        out = {}
        for n in people:
            path = require_file(layout.test_files.get(n, Path(self.data_dir) / f"test_{n}ppl.jsonl"),
                                f"{n}-people test")
            puzzles = self._read(path)
            wrong = [p.num_people for p in puzzles if p.num_people != n]
            if wrong:
                raise ValueError(f"{path}: a {n}-people test file holds puzzles with N={sorted(set(wrong))}")
            out[f"kk_{n}ppl"] = self._val_set(f"kk_{n}ppl", puzzles, path, expected=LOGIC_RL_TEST)
        return out

    def _val_set(self, name: str, puzzles: list[Puzzle], path, expected: int | None = None) -> list[Puzzle]:
        """A configured validation set read from ``path``: an empty file is an error naming it (the
        set would otherwise vanish from ``val/kk/mean``); a set smaller than asked for
        (``val_count_per_n``, else the official size ``expected``) is logged with its size."""
        if not puzzles:
            raise ValueError(f"validation set {name!r}: {path} holds no puzzles; fix or remove the file (or drop "
                             "the set from data.val_people / data.val_files)")
        cut = self._cut(puzzles, self.val_count_per_n, str(path))
        want = self.val_count_per_n if self.val_count_per_n is not None else expected
        if want is not None and len(cut) < want:
            log.warning("validation set %s: %d puzzles from %s, fewer than the %d asked for", name, len(cut),
                        path, want)
        else:
            log.info("validation set %s: %d puzzles from %s", name, len(cut), path)
        return cut

    def _read(self, path: Path | str) -> list[Puzzle]:
        return read_puzzles(path, verify=self.verify_solutions, require_prompt=self.template == OFFICIAL)

    def _generated_split(self, n: int) -> tuple[list[Puzzle], list[Puzzle]]:
        if self._generated is None:
            self._generated = {}
        if n not in self._generated:
            train = LOGIC_RL_TRAIN if self.train_count_per_n is None else self.train_count_per_n
            test = LOGIC_RL_TEST if self.val_count_per_n is None else self.val_count_per_n
            self._generated[n] = generated_split(n, train, test, self.generator_seed, OFFICIAL_SKIP)
        return self._generated[n]

    @staticmethod
    def _cut(puzzles: list[Puzzle], count: int | None, what: str) -> list[Puzzle]:
        if count is None:
            return puzzles
        if count > len(puzzles):
            raise ValueError(f"{what}: asked for {count} puzzles per N but it has only {len(puzzles)}")
        return puzzles[:count]

    # ---- records ----------------------------------------------------------------------------
    def _records(self, puzzles: list[Puzzle], split: str) -> list[PromptRecord]:
        records, seen = [], set()
        for i, p in enumerate(puzzles):
            index = p.index if p.index is not None else i
            uid = f"kk/{split}/{p.num_people}ppl/{index}"
            if uid in seen:
                raise ValueError(f"K&K {split} set: two puzzles share uid {uid!r} (same N and 'index'); "
                                 "every puzzle of one N needs its own index")
            seen.add(uid)
            records.append(build_prompt(p, self.template).to_prompt_record(
                uid=uid, ground_truth=p.solution_text_format, task="kk",
                meta={"n_people": p.num_people, "split": split, "index": index}))
        return records

    def train_records(self) -> list[PromptRecord]:
        return self._records(self.train_puzzles(), "train")

    def val_records(self) -> dict[str, list[PromptRecord]]:
        return {name: self._records(puzzles, "test") for name, puzzles in self.val_puzzles().items()}
