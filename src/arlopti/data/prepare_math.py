"""``python -m arlopti.data.prepare dsr_uniform|deepscaler|orz``: write a math prompt set.

All three write the same JSONL schema: ``problem``, ``answer`` (str, number or list), and
``difficulty`` / ``source_index`` when the source has them. Default output:
``data/prepared/<name>/train.jsonl`` (relative to the working directory; run from the repo
root so that ``configs/data/<name>.yaml`` finds it).

Sources, first match wins:

* ``--input FILE``: a local ``.parquet`` / ``.jsonl`` / ``.jsonl.gz`` / ``.json`` in any layout
  :mod:`arlopti.tasks.math.readers` recognises (plain problem/answer, AR-Lopti verl parquet,
  ORZ dialogues);
* ``dsr_uniform`` without ``--input``: the shared fixture
  ``fixtures/math/dsr_uniform_train_10k.jsonl.gz`` (all 10,000 problems of AR-Lopti's
  ``data/deepscaler_c/deepscaler_uniform_train.parquet``) when present;
* otherwise the Hugging Face dataset (``--hf-dataset``; default
  ``agentica-org/DeepScaleR-Preview-Dataset`` for ``deepscaler``, none for the others).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arlopti.config import ConfigError
from arlopti.tasks.math.readers import MathProblem, convert_rows, read_math_file, write_jsonl

DATASETS = ("dsr_uniform", "deepscaler", "orz")
HF_DEFAULTS: dict[str, tuple[str, str] | None] = {
    "deepscaler": ("agentica-org/DeepScaleR-Preview-Dataset", "train"),
    "dsr_uniform": None,
    "orz": None,
}
OFFICIAL_FILES = {
    "dsr_uniform": "data/deepscaler_c/deepscaler_uniform_train.parquet in github.com/zhyang2226/AR-Lopti",
    "deepscaler": "deepscaler_train.parquet (AR-Lopti data/deepscaler/) or the HF dataset's JSON",
    "orz": "data/orz_math_57k_collected.json in github.com/Open-Reasoner-Zero/Open-Reasoner-Zero",
}
DSR_UNIFORM_FIXTURE = "dsr_uniform_train_10k.jsonl.gz"


class PrepareError(RuntimeError):
    """A source could not be read; the message says what to pass instead."""


def default_output(name: str) -> Path:
    return Path("data") / "prepared" / name / "train.jsonl"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """Options of the ``<name>`` sub-command."""
    hf = HF_DEFAULTS[name]
    parser.add_argument("--input", type=Path, default=None,
                        help="local source file (.parquet/.jsonl/.jsonl.gz/.json), "
                             f"e.g. {OFFICIAL_FILES[name]}")
    parser.add_argument("--output", type=Path, default=default_output(name),
                        help=f"where to write the JSONL (default: {default_output(name)})")
    parser.add_argument("--hf-dataset", default=hf[0] if hf else None,
                        help="Hugging Face dataset id to load when no --input is given "
                             f"(default: {hf[0] if hf else 'none'})")
    parser.add_argument("--hf-split", default=hf[1] if hf else "train", help="split of --hf-dataset")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N problems")
    parser.set_defaults(math_name=name)


def _from_hub(name: str, dataset_id: str, split: str, limit: int | None) -> list[MathProblem]:
    try:
        import datasets

        rows = datasets.load_dataset(dataset_id, split=split)
    except Exception as err:  # noqa: BLE001  (offline, missing or renamed dataset)
        raise PrepareError(
            f"{name}: could not load {dataset_id} (split {split}) from the Hugging Face hub "
            f"({type(err).__name__}: {str(err)[:200]}). Without network access pass a local copy: "
            f"--input FILE, e.g. {OFFICIAL_FILES[name]}"
        ) from None
    return convert_rows(rows, f"hf:{dataset_id}", limit)


def load_problems(args: argparse.Namespace) -> tuple[list[MathProblem], str]:
    """The problems named by ``args`` and a description of where they came from."""
    name = getattr(args, "math_name", None) or args.dataset
    if args.input is not None:
        if not Path(args.input).exists():
            raise PrepareError(f"{name}: --input {args.input} does not exist")
        return read_math_file(args.input, args.limit), str(args.input)
    if name == "dsr_uniform":
        from arlopti.tasks.math.benchmarks import default_math_dir

        fixture = default_math_dir() / DSR_UNIFORM_FIXTURE
        if fixture.exists():
            return read_math_file(fixture, args.limit), str(fixture)
    if args.hf_dataset:
        return _from_hub(name, args.hf_dataset, args.hf_split, args.limit), f"hf:{args.hf_dataset}"
    raise PrepareError(f"{name}: no source; pass --input FILE, e.g. {OFFICIAL_FILES[name]}, "
                       "or --hf-dataset ID")


def run(args: argparse.Namespace) -> int:
    """Read the source, write ``args.output``; returns the exit code (0 ok, 1 error)."""
    name = getattr(args, "math_name", None) or args.dataset
    try:
        problems, source = load_problems(args)
    except ConfigError:
        raise  # one line and exit status 1, as every command reports it (arlopti.config.cli_report)
    except (PrepareError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not problems:
        print(f"error: {name}: {source} holds no problems", file=sys.stderr)
        return 1
    out = write_jsonl(problems, args.output)
    with_diff = sum(p.difficulty is not None for p in problems)
    print(f"{name}: wrote {len(problems)} problems ({with_diff} with difficulty) from {source} "
          f"to {out.resolve()}")
    return 0
