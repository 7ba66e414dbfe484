"""Where K&K puzzles come from: record files on disk, the official split rules, our generator.

Layouts of a data folder that :func:`find_layout` understands:

* ``prepare kk`` output: ``train.jsonl`` (merged, per-N sets concatenated in ascending N) and
  ``test_{N}ppl.jsonl`` per N;
* the shared fixture layout (AR-Lopti files): ``kk_train_34567ppl.jsonl.gz`` (900 per N) and
  ``kk_test_{N}ppl.jsonl`` (100 per N).

Per-N official files ``people{N}_num1000.jsonl`` (mem-kk-logic / HF ``K-and-K/knights-and-knaves``
train folder, generator indices 100..1099) are split the Logic-RL way by :func:`logic_rl_split`:
the first 900 rows are train, the next 100 test.

:func:`generated_split` draws the same positions from our generator: with the original seed 1234
the logical puzzles of positions 100..999 and 1000..1099 are exactly the Logic-RL train and test
puzzles (the English text and names are ours).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from arlopti.prompts.readers import iter_records
from arlopti.tasks.kk.generator import OFFICIAL_SEED, check_num_people, sample_puzzles
from arlopti.tasks.kk.puzzle import Puzzle

# Positions 0..99 of each original stream are the HF *test* split; Logic-RL starts after them.
OFFICIAL_SKIP = 100
LOGIC_RL_TRAIN, LOGIC_RL_TEST = 900, 100
PREPARE_HINT = ("create it with `python -m arlopti.data.prepare kk --source files --input-dir "
                "../shared/fixtures/kk --out data/prepared/kk_files` (official fixture files) or "
                "`python -m arlopti.data.prepare kk --source generated` (our generator, offline)")

_TEST_NAME = re.compile(r"^(?:kk_)?test_(\d+)ppl\.jsonl(?:\.gz)?$")
_PER_N_NAME = re.compile(r"^people(\d+)_num(\d+)\.jsonl(?:\.gz)?$")


MISSING_PROMPT_FIX = ("use data.template=qwen-instruct (our wording through the tokenizer's chat template), "
                      "or a source whose records carry the official 'prompt' field (the shared fixtures "
                      "fixtures/kk/kk_*.jsonl[.gz], or a `python -m arlopti.data.prepare kk --source files "
                      "--input-dir <those fixtures>` output)")


def read_puzzles(path: str | Path, verify: bool = True, require_prompt: bool = False) -> list[Puzzle]:
    """Every record of ``path`` as a :class:`Puzzle`; errors name ``path:line`` and the field.

    With ``verify`` the stored solution must be the unique consistent assignment. With
    ``require_prompt`` (prompt template ``official``) every record must carry the official
    ``prompt`` field; the ``ValueError`` names ``path:line``, the record index and the fix.
    """
    out = []
    for i, (where, rec) in enumerate(iter_records(path)):
        puzzle = Puzzle.from_record(rec, source=where, verify=verify)
        if require_prompt and puzzle.prompt is None:
            raise ValueError(
                f"{where} (record {i}): field 'prompt' is missing, but the K&K prompt template 'official' "
                f"feeds each record's own official prompt; {MISSING_PROMPT_FIX}")
        out.append(puzzle)
    return out


def by_num_people(puzzles: list[Puzzle]) -> dict[int, list[Puzzle]]:
    """Group puzzles by N, keeping their order within each N; keys ascending."""
    out: dict[int, list[Puzzle]] = {}
    for p in puzzles:
        out.setdefault(p.num_people, []).append(p)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Layout:
    """The files of a data folder: one merged train file and one test file per N."""

    train_file: Path | None
    test_files: dict[int, Path]


def find_layout(data_dir: str | Path) -> Layout:
    """The train file and per-N test files in ``data_dir`` (see module docstring).

    Raises ``FileNotFoundError`` (with how to create the data) if the folder does not exist or
    holds neither a train file nor a test file.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"K&K data folder {data_dir} does not exist; {PREPARE_HINT}")
    train = None
    for pattern in ("train.jsonl", "train.jsonl.gz", "kk_train_*ppl.jsonl", "kk_train_*ppl.jsonl.gz"):
        found = sorted(data_dir.glob(pattern))
        if len(found) > 1:
            raise ValueError(f"{data_dir}: several train files match {pattern!r}: {[f.name for f in found]}; "
                             "keep one or pass data.train_file explicitly")
        if found:
            train = found[0]
            break
    tests: dict[int, Path] = {}
    for f in sorted(data_dir.iterdir()):
        m = _TEST_NAME.match(f.name)
        if m:
            n = int(m.group(1))
            if n in tests:
                raise ValueError(f"{data_dir}: two test files for N={n}: {tests[n].name}, {f.name}")
            tests[n] = f
    if train is None and not tests:
        raise FileNotFoundError(f"{data_dir} holds no K&K train file (train.jsonl or kk_train_*ppl.jsonl.gz) "
                                f"and no test_{{N}}ppl.jsonl file; {PREPARE_HINT}")
    return Layout(train_file=train, test_files=dict(sorted(tests.items())))


def require_file(path: str | Path | None, what: str) -> Path:
    """``Path(path)`` if it is a file, else ``FileNotFoundError`` naming it with the hint."""
    if path is None or not Path(path).is_file():
        raise FileNotFoundError(f"K&K {what} file {path} not found; {PREPARE_HINT}")
    return Path(path)


def find_per_n_files(input_dir: str | Path) -> dict[int, Path]:
    """``people{N}_num{M}.jsonl`` files in ``input_dir`` by N (mem-kk-logic / HF train layout)."""
    out: dict[int, Path] = {}
    for f in sorted(Path(input_dir).iterdir()):
        m = _PER_N_NAME.match(f.name)
        if m:
            n = int(m.group(1))
            if n in out:
                raise ValueError(f"{input_dir}: two per-N files for N={n}: {out[n].name}, {f.name}")
            out[n] = f
    return dict(sorted(out.items()))


def take(puzzles: list[Puzzle], start: int, count: int, what: str) -> list[Puzzle]:
    """``puzzles[start:start+count]``, or ``ValueError`` if there are fewer rows."""
    if start + count > len(puzzles):
        raise ValueError(f"{what}: needs rows {start}..{start + count - 1} but has only {len(puzzles)}")
    return puzzles[start:start + count]


def logic_rl_split(rows: list[Puzzle], train_count: int = LOGIC_RL_TRAIN, test_count: int = LOGIC_RL_TEST,
                   what: str = "per-N file") -> tuple[list[Puzzle], list[Puzzle]]:
    """The Logic-RL split of one per-N official train file: first ``train_count`` rows are train,
    the next ``test_count`` are test."""
    return take(rows, 0, train_count, what), take(rows, train_count, test_count, what)


def generated_split(num_people: int, train_count: int, test_count: int, seed: int = OFFICIAL_SEED,
                    skip: int = OFFICIAL_SKIP) -> tuple[list[Puzzle], list[Puzzle]]:
    """Train = stream positions ``[skip, skip+train_count)``, test = the next ``test_count``.

    Defaults (seed 1234, skip 100, 900/100) reproduce the Logic-RL logical puzzles.
    """
    check_num_people(num_people)
    if min(train_count, test_count, skip) < 0:
        raise ValueError(f"generated_split: counts must be >= 0, got skip={skip} train={train_count} "
                         f"test={test_count}")
    stream = sample_puzzles(num_people, skip + train_count + test_count, seed)
    return stream[skip:skip + train_count], stream[skip + train_count:]
