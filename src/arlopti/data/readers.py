"""Generic record readers and writers: JSON Lines (plain or gzip), a JSON list, parquet.

Every reader yields ``(location, record)`` where ``location`` is ``"path:line"`` (JSONL), or
``"path[i]"`` (JSON list, parquet rows), so callers can name the exact place of a bad record.
Errors are ``ValueError``/``FileNotFoundError`` that name the file and line.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def _kind(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".jsonl.gz", ".jsonl", ".json", ".parquet"):
        if name.endswith(suffix):
            return suffix
    raise ValueError(f"{path}: unknown record file type; expected one of {list(SUFFIXES)}")


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(location, record)`` for every record of ``path`` (type chosen by suffix).

    Blank JSONL lines are skipped. A line that is not valid JSON, or a record that is not a JSON
    object, raises ``ValueError`` naming ``path:line``.
    """
    path = Path(path)
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
    else:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several unrelated types for a corrupt file
            raise ValueError(f"{path}: cannot read parquet ({type(err).__name__}: {err})") from None
        for i, record in enumerate(rows):
            yield f"{path}[{i}]", record


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
