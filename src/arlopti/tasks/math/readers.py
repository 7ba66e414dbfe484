"""Read math problem sets from local files into one schema: problem, answer, difficulty, index.

Files: ``.parquet``, ``.jsonl``, ``.jsonl.gz``, ``.json`` (a JSON list, or JSON Lines under a
``.json`` name). Record layouts recognised, per record:

* **plain** - ``problem`` (or ``question``) and ``answer``: the prepared files, the shared
  DSR-Uniform fixture (``difficulty``, ``dsr_index``), DeepScaleR's raw JSON, the benchmarks;
* **verl** - the official AR-Lopti / DeepScaleR parquet rows: ``prompt`` = [{role: user,
  content: problem + suffix}], ``reward_model.ground_truth``, ``extra_info.{index,difficulty}``;
  the instruction suffix is stripped;
* **ORZ dialogue** - a two-turn list ``[{"from": "human", "value": problem},
  {"from": "assistant", "ground_truth": {"value": answer}}]``;
* **ORZ eval** - ``{"prompt": [{"from": "user", "value": problem}], "final_answer": answer}``.

An answer must be a str, int, float, or a non-empty list of those; anything else is a
ValueError naming the file and the record index.
"""

from __future__ import annotations

import gzip
import json
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from arlopti.tasks.math.prompts import strip_suffix

Answer = str | int | float | list


@dataclass(frozen=True)
class MathProblem:
    """One problem: ``answer`` is a str, int, float or a list of these (any of them is correct)."""

    problem: str
    answer: Answer
    difficulty: float | None = None
    source_index: int | None = None

    def to_json(self) -> dict:
        """The prepared-file record: ``problem``, ``answer`` and the optional fields when set."""
        out: dict[str, Any] = {"problem": self.problem, "answer": self.answer}
        if self.difficulty is not None:
            out["difficulty"] = self.difficulty
        if self.source_index is not None:
            out["source_index"] = self.source_index
        return out


def _is_scalar_answer(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, numbers.Real) and not isinstance(x, bool))


def check_answer(answer: Any, where: str) -> Answer:
    """Return ``answer`` (tuples become lists) or raise ValueError naming ``where``."""
    if _is_scalar_answer(answer):
        return answer.item() if hasattr(answer, "item") else answer  # numpy scalars -> Python
    if isinstance(answer, (list, tuple)) and answer and all(_is_scalar_answer(a) for a in answer):
        return [a.item() if hasattr(a, "item") else a for a in answer]
    raise ValueError(
        f"{where}: the answer has an unsupported type {type(answer).__name__} ({answer!r:.80}); "
        "expected a str, int, float or a non-empty list of those"
    )


def _number_or_none(x: Any) -> float | None:
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return float(x)
    return None


def _int_or_none(x: Any) -> int | None:
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    return None


def record_to_problem(record: Any, where: str) -> MathProblem:
    """Convert one record of any recognised layout (see module doc); ValueError otherwise."""
    if isinstance(record, (list, tuple)):  # ORZ two-turn dialogue
        turns = list(record)
        human = next((t for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")), None)
        bot = next((t for t in turns if isinstance(t, dict) and isinstance(t.get("ground_truth"), dict)),
                   None)
        if human is None or bot is None or "value" not in bot["ground_truth"]:
            raise ValueError(f"{where}: an ORZ dialogue needs a human turn with 'value' and an assistant "
                             "turn with 'ground_truth': {'value': ...}")
        return MathProblem(str(human.get("value", "")).strip(),
                           check_answer(bot["ground_truth"]["value"], where))
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be an object or an ORZ dialogue list, "
                         f"got {type(record).__name__}")
    if isinstance(record.get("prompt"), (list, tuple)) and isinstance(record.get("reward_model"), dict):
        users = [m for m in record["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
        if not users or "ground_truth" not in record["reward_model"]:
            raise ValueError(f"{where}: a verl row needs a user message in 'prompt' and "
                             "'reward_model.ground_truth'")
        extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
        return MathProblem(strip_suffix(str(users[-1].get("content", ""))),
                           check_answer(record["reward_model"]["ground_truth"], where),
                           _number_or_none(extra.get("difficulty")), _int_or_none(extra.get("index")))
    if isinstance(record.get("prompt"), (list, tuple)) and "final_answer" in record:  # ORZ eval files
        users = [m for m in record["prompt"] if isinstance(m, dict) and "value" in m]
        if not users:
            raise ValueError(f"{where}: an ORZ eval record needs a prompt turn with 'value'")
        return MathProblem(str(users[-1]["value"]).strip(), check_answer(record["final_answer"], where))
    problem = record.get("problem", record.get("question"))
    if not isinstance(problem, str) or "answer" not in record:
        raise ValueError(f"{where}: expected 'problem' (or 'question') and 'answer' fields, got keys "
                         f"{sorted(record)[:12]}")
    index = next((record[k] for k in ("source_index", "dsr_index", "index", "idx") if k in record), None)
    # not stripped: the official prompt is the problem byte for byte + SUFFIX
    return MathProblem(strip_suffix(problem), check_answer(record["answer"], where),
                       _number_or_none(record.get("difficulty")), _int_or_none(index))


def _json_lines(lines: Iterable[str], path: Path) -> list:
    out = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
    return out


def read_raw_records(path: str | Path) -> list:
    """The records of a parquet / JSONL / JSONL.gz / JSON file, as Python objects."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return _json_lines(fh, path)
    if name.endswith(".jsonl"):
        with open(path, encoding="utf-8") as fh:
            return _json_lines(fh, path)
    if name.endswith(".json"):
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return _json_lines(text.splitlines(), path)  # JSON Lines under a .json name
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json file must hold a list of records")
        return data
    raise ValueError(f"{path}: unsupported file type; use .parquet, .jsonl, .jsonl.gz or .json")


def read_math_file(path: str | Path, limit: int | None = None) -> list[MathProblem]:
    """All problems of ``path`` (the first ``limit`` when given), validated."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"math data file {path} does not exist")
    records = read_raw_records(path)
    if limit is not None:
        records = records[:limit]
    return [record_to_problem(r, f"{path}: record {i}") for i, r in enumerate(records)]


def convert_rows(rows: Iterable[Any], where: str, limit: int | None = None) -> list[MathProblem]:
    """Like :func:`read_math_file` for rows already in memory (e.g. a HF dataset)."""
    out = []
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            break
        out.append(record_to_problem(row, f"{where}: record {i}"))
    return out


def write_jsonl(problems: list[MathProblem], path: str | Path) -> Path:
    """Write the prepared schema (one JSON object per line), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for p in problems:
            fh.write(json.dumps(p.to_json(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
