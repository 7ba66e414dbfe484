"""Loading a script of ``benchmarks/`` as a module, as its smoke tests do."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load_bench(name: str, monkeypatch, out_dir: Path | None = None):
    """``benchmarks/<name>.py`` as a module: the folder goes first on ``sys.path`` (the script imports its
    ``_common`` as a run from benchmarks/ does), and with ``out_dir`` ``_common`` writes its JSON there."""
    monkeypatch.syspath_prepend(str(BENCH))
    if out_dir is not None:
        import _common

        monkeypatch.setattr(_common, "OUT_DIR", out_dir)
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
