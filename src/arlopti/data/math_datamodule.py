"""Math prompt sets (DSR-Uniform, DeepScaleR, ORZ) and math benchmarks as a Lightning DataModule.

Train prompts come from one file (any layout :mod:`arlopti.tasks.math.readers` reads: the
prepared JSONL, the shared DSR-Uniform fixture, a verl parquet, ORZ JSON); validation sets are
benchmarks from :mod:`arlopti.tasks.math.benchmarks`. Each problem becomes the official prompt
(problem + suffix) in the ``raw`` or ``chat`` template. Tokenising, length filtering, sharding
and resumable order come from :class:`~arlopti.data.prompt_datamodule.PromptDataModule`.

Records: ``uid = "math/<dataset>/<row index in the file>"`` (benchmarks:
``math/<benchmark>/<index>``), ``task = "math"``, ``ground_truth`` = the answer (str, number or
list), ``meta = {"dataset", "split"}`` plus ``difficulty`` when the source has one.
"""

from __future__ import annotations

import logging
from pathlib import Path

from arlopti.tasks.math.readers import read_math_file
from arlopti.data.prompt_datamodule import PromptDataModule
from arlopti.prompts.records import PromptRecord
from arlopti.tasks.math.prompts import TEMPLATES, build_prompt

log = logging.getLogger(__name__)


def _dataset_name_from(path: Path) -> str:
    """``data/prepared/orz/train.jsonl`` -> ``orz``; ``dsr_uniform_train_10k.jsonl.gz`` ->
    ``dsr_uniform_train_10k`` (the file name up to its first dot)."""
    if path.name.split(".")[0] == "train" and path.parent.name:
        return path.parent.name
    return path.name.split(".")[0]


class MathDataModule(PromptDataModule):
    """See the module docstring. ``limit`` keeps the first N training problems of the file."""

    task_name = "math"

    def __init__(self, tokenizer=None, prompts_per_step: int = 8, max_prompt_length: int = 1024,
                 seed: int = 42, shuffle: bool = True, num_workers: int = 0,
                 train_file: str | Path | None = None, dataset_name: str | None = None,
                 template: str = "raw", val_benchmarks: list[str] | None = None,
                 val_limit: int | None = None, val_data_dir: str | Path | None = None,
                 limit: int | None = None, val_max_prompt_length: int | None = None):
        super().__init__(tokenizer=tokenizer, prompts_per_step=prompts_per_step,
                         max_prompt_length=max_prompt_length, seed=seed, shuffle=shuffle,
                         num_workers=num_workers, val_max_prompt_length=val_max_prompt_length)
        if template not in TEMPLATES:
            raise ValueError(f"data.template={template!r} is unknown; known templates: {list(TEMPLATES)}")
        if train_file is None:
            raise ValueError("MathDataModule needs data.train_file (see configs/data/dsr_uniform.yaml)")
        self.train_file = Path(train_file)
        self.dataset_name = dataset_name or _dataset_name_from(self.train_file)
        self.template = template
        self.val_benchmarks = list(val_benchmarks or [])
        self.val_limit = val_limit
        self.val_data_dir = val_data_dir
        self.limit = limit
        if self.val_benchmarks:
            from arlopti.tasks.math.benchmarks import list_benchmarks

            unknown = [b for b in self.val_benchmarks if b not in list_benchmarks()]
            if unknown:
                raise ValueError(f"data.val_benchmarks has unknown names {unknown}; "
                                 f"known: {list_benchmarks()}")

    def _record(self, uid: str, problem: str, answer, meta: dict) -> PromptRecord:
        return PromptRecord(uid=uid, ground_truth=answer, task="math", meta=meta,
                            **build_prompt(problem, self.template))

    def train_records(self) -> list[PromptRecord]:
        if not self.train_file.exists():
            raise FileNotFoundError(
                f"math training file {self.train_file} does not exist; create it with "
                f"`python -m arlopti.data.prepare {self.dataset_name} --output {self.train_file}` "
                "(see --help for --input) or point data.train_file at an existing file"
            )
        records = []
        for i, p in enumerate(read_math_file(self.train_file, self.limit)):
            meta = {"dataset": self.dataset_name, "split": "train"}
            if p.difficulty is not None:
                meta["difficulty"] = p.difficulty
            records.append(self._record(f"math/{self.dataset_name}/{i}", p.problem, p.answer, meta))
        return records

    def val_records(self) -> dict[str, list[PromptRecord]]:
        if not self.val_benchmarks:
            return {}
        from arlopti.tasks.math.benchmarks import load_benchmark

        out = {}
        from arlopti.tasks.math.benchmarks import BENCHMARKS, default_math_dir

        for name in self.val_benchmarks:
            items = load_benchmark(name, self.val_data_dir, self.val_limit)
            folder = Path(self.val_data_dir) if self.val_data_dir is not None else default_math_dir()
            where = folder / BENCHMARKS[name].filename
            if not items:  # an empty file would silently drop out of val/math/mean
                raise ValueError(f"validation benchmark {name!r}: {where} holds no problems; fix the file or "
                                 "drop it from data.val_benchmarks")
            want = self.val_limit  # without a limit, load_benchmark warns when a file is not its full size
            if want is not None and len(items) < want:
                log.warning("validation benchmark %s: %d problems from %s, fewer than the %d asked for", name,
                            len(items), where, want)
            else:
                log.info("validation benchmark %s: %d problems from %s", name, len(items), where)
            out[name] = [self._record(it.uid, it.problem, it.answer, {"dataset": name, "split": "test"})
                         for it in items]
        return out
