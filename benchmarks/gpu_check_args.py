"""The command line every part of benchmarks/gpu_check.sh takes: ``--dry-run`` and ``--out``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def check_parser(doc: str, dry_help: str) -> argparse.ArgumentParser:
    """A parser with ``--dry-run`` (help ``dry_help``) and ``--out DIR`` (default ``$OUT`` or the run tree's
    ``logs/gpu_check``, where gpu_check.sh collects the JSON reports); add the part's own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help=dry_help)
    ap.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).resolve().parents[1] / "logs" / "gpu_check")))
    return ap
