"""Generic record readers and writers: JSON Lines (plain or gzip), a JSON list, parquet, CSV, and a
``datasets`` folder (``save_to_disk`` output).

Every reader yields ``(location, record)`` where ``location`` is ``"path:line"`` (JSONL, CSV), or
``"path[i]"`` (JSON list, parquet rows, dataset folder rows), so callers can name the exact place
of a bad record. Errors are ``ValueError``/``FileNotFoundError`` that name the file and line.
CSV: the first line is the header; every value is a string; a row with more or fewer fields
than the header is an error naming ``path:line``.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")


def _kind(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".jsonl.gz", ".jsonl", ".json", ".parquet", ".csv"):
        if name.endswith(suffix):
            return suffix
    raise ValueError(f"{path}: unknown record file type; expected one of {list(SUFFIXES)}")


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(location, record)`` for every record of ``path`` (type chosen by suffix).

    Blank JSONL lines are skipped. A line that is not valid JSON, or a record that is not a JSON
    object, raises ``ValueError`` naming ``path:line``.
    """
    path = Path(path)
    if path.is_dir():
        yield from iter_dataset_folder(path)
        return
    if not path.is_file():
        raise FileNotFoundError(f"record file {path} does not exist")
    kind = _kind(path)
    if kind in (".jsonl", ".jsonl.gz"):
        opener = gzip.open if kind == ".jsonl.gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(
                            f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
                    if not isinstance(record, dict):
                        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
                    yield where, record
        except (OSError, EOFError, UnicodeDecodeError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise ValueError(f"{path}: cannot read ({type(err).__name__}: {err})") from None
    elif kind == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        for i, record in enumerate(data):
            if not isinstance(record, dict):
                raise ValueError(f"{path}[{i}]: expected a JSON object, got {type(record).__name__}")
            yield f"{path}[{i}]", record
    elif kind == ".csv":
        yield from _iter_csv(path)
    else:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several unrelated types for a corrupt file
            raise ValueError(f"{path}: cannot read parquet ({type(err).__name__}: {err})") from None
        for i, record in enumerate(rows):
            yield f"{path}[{i}]", record


def _iter_csv(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                return
            start = reader.line_num + 1
            for row in reader:
                where = f"{path}:{start}"
                start = reader.line_num + 1
                if not row:
                    continue
                if len(row) != len(header):
                    raise ValueError(f"{where}: {len(row)} fields, but the header ({path}:1) has {len(header)}: "
                                     f"{header}")
                yield where, dict(zip(header, row))
    except csv.Error as err:
        raise ValueError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: cannot read ({type(err).__name__}: {err})") from None


def iter_dataset_folder(path: str | Path, split: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a ``datasets`` folder (``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``), as
    ``("path[i]", row)``. A ``DatasetDict`` needs ``split`` unless it holds a single split."""
    path = Path(path)
    try:
        from datasets import DatasetDict, load_from_disk
    except ImportError:
        raise ValueError(f"{path} is a folder: reading a datasets folder needs the `datasets` package "
                         "(pip install datasets)") from None
    try:
        ds = load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - datasets raises several types for a folder it cannot read
        raise ValueError(f"{path}: not a datasets folder (save_to_disk output): "
                         f"{type(err).__name__}: {err}") from None
    where = str(path)
    if isinstance(ds, DatasetDict):
        splits = list(ds)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in ds:
            raise ValueError(f"{path} holds the splits {splits}: name one as {path}@<split>")
        ds, where = ds[split], f"{path}@{split}"
    elif split is not None:
        raise ValueError(f"{path} is a single dataset (no splits); drop '@{split}'")
    for i, row in enumerate(ds):
        yield f"{where}[{i}]", dict(row)


def read_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """All of :func:`iter_records` as a list."""
    return list(iter_records(path))


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> Path:
    """Write records as UTF-8 JSON Lines (gzip when the name ends in ``.gz``), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
