"""The math benchmark registry: AIME 2024, AMC (83 and 40), MATH-500, Minerva, OlympiadBench.

``load_benchmark(name)`` reads the local JSONL file of the benchmark from ``data_dir``
(default :func:`default_math_dir`: ``$ARLOPTI_SHARED/fixtures/math``, else
``<repo>/../shared/fixtures/math``). When the file is absent and the benchmark has a known
Hugging Face dataset, that is tried unless the hub is offline; otherwise the error names the
local path to provide.

Names (see :data:`BENCHMARKS`): ``aime24`` (30), ``amc83`` (AMC12 2022+2023, 83: the set the
official code evaluates), ``amc23`` (AMC12 2023, 40, Qwen2.5-Math's file), ``math500`` (500),
``minerva`` (272), ``olympiadbench`` (675). Answers keep their stored type: AMC golds are
floats such as ``142.0``; Minerva and OlympiadBench golds are lists (any item is correct).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlopti.tasks.math.readers import Answer, convert_rows, read_math_file

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[4]


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives: local ``filename`` in the math data dir, optional HF source."""

    name: str
    filename: str
    size: int
    description: str
    hf_id: str | None = None
    hf_split: str | None = None


@dataclass(frozen=True)
class BenchmarkItem:
    """One benchmark problem; ``uid`` is ``math/<benchmark>/<index in the file>``."""

    problem: str
    answer: Answer
    uid: str


BENCHMARKS: dict[str, BenchmarkSpec] = {}


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    """Add (or replace) a benchmark in the registry."""
    BENCHMARKS[spec.name] = spec
    return spec


for _spec in (
    BenchmarkSpec("aime24", "aime2024.jsonl", 30, "AIME 2024 I and II", "HuggingFaceH4/aime_2024", "train"),
    BenchmarkSpec("amc83", "amc_2022_2023_83.jsonl", 83, "AMC12 2022 A/B + 2023 A/B (DeepScaleR 'amc')"),
    BenchmarkSpec("amc23", "amc2023_40.jsonl", 40, "AMC12 2023 A/B (Qwen2.5-Math 'amc23')"),
    BenchmarkSpec("math500", "math500.jsonl", 500, "MATH-500 (PRM800K test split)",
                  "HuggingFaceH4/MATH-500", "test"),
    BenchmarkSpec("minerva", "minerva_math.jsonl", 272, "Minerva Math"),
    BenchmarkSpec("olympiadbench", "olympiadbench_675.jsonl", 675, "OlympiadBench, English text-only math"),
):
    register_benchmark(_spec)


def default_math_dir() -> Path:
    """``$ARLOPTI_SHARED/fixtures/math`` if ``ARLOPTI_SHARED`` is set, else
    ``<repo>/../shared/fixtures/math``."""
    shared = os.environ.get("ARLOPTI_SHARED")
    return (Path(shared) if shared else REPO_ROOT.parent / "shared") / "fixtures" / "math"


def list_benchmarks() -> list[str]:
    """Registered benchmark names, in registration order."""
    return list(BENCHMARKS)


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _load_from_hub(spec: BenchmarkSpec, limit: int | None, local: Path) -> list:
    try:
        import datasets

        rows = datasets.load_dataset(spec.hf_id, split=spec.hf_split)
    except Exception as err:  # noqa: BLE001  (offline, missing, renamed: all mean "use the file")
        raise FileNotFoundError(
            f"benchmark {spec.name!r}: {local} does not exist and loading {spec.hf_id} from the "
            f"Hugging Face hub failed ({type(err).__name__}: {str(err)[:200]}); put "
            f"{spec.filename} in that folder, pass data_dir=, or set ARLOPTI_SHARED"
        ) from None
    return convert_rows(rows, f"hf:{spec.hf_id}", limit)


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None,
                   allow_hub: bool | None = None) -> list[BenchmarkItem]:
    """The problems of benchmark ``name`` (the first ``limit`` when given).

    ``allow_hub``: None = try the hub only when the local file is missing and the hub is not
    marked offline (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``); False = never.
    Raises KeyError for an unknown name, FileNotFoundError naming the local path otherwise.
    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {list_benchmarks()}")
    spec = BENCHMARKS[name]
    folder = Path(data_dir) if data_dir is not None else default_math_dir()
    local = folder / spec.filename
    if local.exists():
        problems = read_math_file(local, limit)
    else:
        use_hub = spec.hf_id is not None and (allow_hub if allow_hub is not None else not _hub_offline())
        if not use_hub:
            if spec.hf_id is None:
                why = "this benchmark has no hub source"
            elif allow_hub is False:
                why = "hub loading is disabled"
            else:
                why = "the hub is marked offline"
            raise FileNotFoundError(
                f"benchmark {name!r}: {local} does not exist ({why}); put {spec.filename} in that "
                "folder, pass data_dir=, or set ARLOPTI_SHARED to the folder holding fixtures/math"
            )
        problems = _load_from_hub(spec, limit, local)
    if limit is None and len(problems) != spec.size:
        log.warning("benchmark %s has %d problems, expected %d", name, len(problems), spec.size)
    return [BenchmarkItem(p.problem, p.answer, f"math/{name}/{i}") for i, p in enumerate(problems)]


def describe() -> list[dict[str, Any]]:
    """One row per registered benchmark (name, file, size, description, hub id)."""
    return [vars(s) for s in BENCHMARKS.values()]
