"""``python -m arlopti.data.prepare kk``: write K&K train/test sets in the official record schema.

Output (``--out DIR``, default ``data/prepared/kk_<source>``, git-ignored):

* ``train.jsonl``: the per-N train sets concatenated in ascending N (as Logic-RL's ``merge_*``);
* ``test_{N}ppl.jsonl``: one test set per N;
* ``manifest.json``: source, arguments and counts.

Records: ``quiz``, ``names``, ``solution``, ``solution_text``, ``solution_text_format``,
``statements`` (Python-literal string), ``index``, ``n_people``, and ``prompt`` (the official
prompt string, verbatim) when the source records carry it: ``--source files`` on the shared
fixtures keeps it, so the output works with ``data.template=official`` (``configs/data/kk.yaml``);
``generated`` and ``hf`` records have none (use ``data.template=qwen-instruct`` with them).

Sources:

``generated`` (default, offline)
    Our generator, seed ``--seed`` (default 1234, the original, the same for every N). Train =
    stream positions ``[--skip, --skip+train)``, test = the next ``test`` positions; with the
    defaults (skip 100, 900/100) the logical puzzles equal the Logic-RL train/test puzzles.
``hf``
    ``K-and-K/knights-and-knaves`` from the Hugging Face hub (``train/people{N}_num1000.jsonl``;
    ``people2_num200``), split the Logic-RL way: the first ``train`` rows of each file are train,
    the next ``test`` rows test. Needs the network.
``files --input-dir DIR``
    Local official files: per-N ``people{N}_num*.jsonl`` (split as for ``hf``), or the shared
    fixture layout (``kk_train_*ppl.jsonl.gz`` with 900 per N and ``kk_test_{N}ppl.jsonl`` with
    100 per N; the first ``train``/``test`` puzzles per N are taken).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arlopti.config import ConfigError
from arlopti.prompts.readers import write_jsonl
from arlopti.tasks.kk.generator import MAX_PEOPLE, MIN_PEOPLE, OFFICIAL_SEED
from arlopti.tasks.kk.puzzle import Puzzle
from arlopti.tasks.kk.sources import (LOGIC_RL_TEST, LOGIC_RL_TRAIN, OFFICIAL_SKIP, by_num_people,
                                      find_layout, find_per_n_files, generated_split, logic_rl_split,
                                      read_puzzles, take)

SOURCES = ("generated", "hf", "files")
HF_DATASET = "K-and-K/knights-and-knaves"


def parse_people(text: str) -> list[int]:
    """"3-7" -> [3..7]; "3,5,8" -> [3, 5, 8]; "4" -> [4]. Sorted, without repeats."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--people {text!r}: use a range like 3-7 or a list like 3,4,5") from None
    bad = [n for n in out if not MIN_PEOPLE <= n <= MAX_PEOPLE]
    if bad:
        raise argparse.ArgumentTypeError(f"--people {text!r}: {bad} outside {MIN_PEOPLE}..{MAX_PEOPLE}")
    return sorted(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--source", choices=SOURCES, default="generated",
                        help="where the puzzles come from (default: generated)")
    parser.add_argument("--input-dir", type=Path, default=None,
                        help="folder of official files (--source files)")
    parser.add_argument("--people", type=parse_people, default=parse_people("3-7"),
                        help="numbers of people, e.g. 3-7 or 2,3,8 (default 3-7)")
    parser.add_argument("--train-count", type=int, default=LOGIC_RL_TRAIN, help="train puzzles per N (900)")
    parser.add_argument("--test-count", type=int, default=LOGIC_RL_TEST, help="test puzzles per N (100)")
    parser.add_argument("--seed", type=int, default=OFFICIAL_SEED,
                        help="generator seed, used for every N (--source generated; default 1234)")
    parser.add_argument("--skip", type=int, default=OFFICIAL_SKIP,
                        help="stream positions skipped before train (--source generated; default 100, "
                             "the HF test split)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default data/prepared/kk_<source>)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing prepared set in --out")


def _from_generated(args) -> dict[int, tuple[list[Puzzle], list[Puzzle]]]:
    return {n: generated_split(n, args.train_count, args.test_count, args.seed, args.skip)
            for n in args.people}


def load_hf_file(n: int) -> list[dict]:
    """Rows of ``train/people{n}_num*.jsonl`` of the HF dataset; raises ``RuntimeError`` offline."""
    filename = f"train/people{n}_num{200 if n == 2 else 1000}.jsonl"
    try:
        import datasets

        ds = datasets.load_dataset(HF_DATASET, data_files={"train": filename}, split="train")
    except Exception as err:  # offline, hub errors, missing file: all end the same way
        raise RuntimeError(
            f"could not load {HF_DATASET}/{filename} from the Hugging Face hub ({type(err).__name__}: "
            f"{str(err)[:300]}). --source hf needs network access; offline, download the files "
            "elsewhere and use --source files --input-dir DIR, or use --source generated") from None
    return [dict(row) for row in ds]


def _from_hf(args) -> dict[int, tuple[list[Puzzle], list[Puzzle]]]:
    out = {}
    for n in args.people:
        where = f"hf:{HF_DATASET}/train/people{n}"
        rows = [Puzzle.from_record(r, source=f"{where}[{i}]", verify=True)
                for i, r in enumerate(load_hf_file(n))]
        out[n] = logic_rl_split(rows, args.train_count, args.test_count, what=where)
    return out


def _from_files(args) -> dict[int, tuple[list[Puzzle], list[Puzzle]]]:
    if args.input_dir is None:
        raise ValueError("--source files needs --input-dir DIR (a folder of official K&K files)")
    if not args.input_dir.is_dir():
        raise FileNotFoundError(f"--input-dir {args.input_dir} is not a folder")
    per_n = find_per_n_files(args.input_dir)
    out = {}
    if per_n:
        for n in args.people:
            if n not in per_n:
                raise FileNotFoundError(
                    f"{args.input_dir}: no people{n}_num*.jsonl (found N={sorted(per_n)})")
            out[n] = logic_rl_split(read_puzzles(per_n[n]), args.train_count, args.test_count,
                                    what=str(per_n[n]))
        return out
    layout = find_layout(args.input_dir)
    if layout.train_file is None:
        raise FileNotFoundError(f"{args.input_dir}: no train file (kk_train_*ppl.jsonl.gz or train.jsonl)")
    train = by_num_people(read_puzzles(layout.train_file))
    for n in args.people:
        if n not in train:
            raise ValueError(f"{layout.train_file}: no {n}-people puzzles (has N={sorted(train)})")
        if n not in layout.test_files:
            raise FileNotFoundError(f"{args.input_dir}: no kk_test_{n}ppl.jsonl")
        test = read_puzzles(layout.test_files[n])
        out[n] = (take(train[n], 0, args.train_count, f"{layout.train_file} (N={n})"),
                  take(test, 0, args.test_count, str(layout.test_files[n])))
    return out


def write_prepared(out_dir: Path, splits: dict[int, tuple[list[Puzzle], list[Puzzle]]], manifest: dict,
                   overwrite: bool = False) -> list[Path]:
    """Write ``train.jsonl``, ``test_{N}ppl.jsonl`` and ``manifest.json``; returns the paths."""
    existing = [out_dir / "train.jsonl", *sorted(out_dir.glob("test_*ppl.jsonl"))] if out_dir.is_dir() else []
    existing = [p for p in existing if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{out_dir} already holds a prepared set ({existing[0].name}); pass --overwrite")
    for stale in existing:  # a test file of an N no longer requested would otherwise linger
        stale.unlink()
    train = [p.to_record() for n in sorted(splits) for p in splits[n][0]]
    paths = [write_jsonl(out_dir / "train.jsonl", train)]
    for n in sorted(splits):
        paths.append(write_jsonl(out_dir / f"test_{n}ppl.jsonl", [p.to_record() for p in splits[n][1]]))
    manifest = {**manifest, "counts": {f"{n}ppl": {"train": len(tr), "test": len(te)}
                                       for n, (tr, te) in sorted(splits.items())}}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return paths + [out_dir / "manifest.json"]


def run(args: argparse.Namespace) -> int:
    """Build the sets and write them; prints a one-line summary per file. Returns 0, or 2 with a
    message on stderr for a user error (missing files, offline hub); a bad count is a :class:`ConfigError`."""
    if min(args.train_count, args.test_count) < 0:
        raise ConfigError(f"--train-count {args.train_count} --test-count {args.test_count}: both must be >= 0")
    out_dir = args.out or Path("data/prepared") / f"kk_{args.source}"
    try:
        loader = {"generated": _from_generated, "hf": _from_hf, "files": _from_files}[args.source]
        splits = loader(args)
        manifest = {"source": args.source, "people": args.people, "train_count": args.train_count,
                    "test_count": args.test_count}
        if args.source == "generated":
            manifest.update(seed=args.seed, skip=args.skip)
        if args.source == "files":
            manifest["input_dir"] = str(args.input_dir)
        paths = write_prepared(out_dir, splits, manifest, overwrite=args.overwrite)
    except ConfigError:
        raise  # one line and exit status 1, as every command reports it (arlopti.config.cli_report)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as err:
        print(f"prepare kk: error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0
