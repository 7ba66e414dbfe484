"""Write prompt sets to disk: ``python -m arlopti.data.prepare <dataset> [options]``.

Datasets: ``kk`` (Knights and Knaves) and ``dsr_uniform`` / ``deepscaler`` / ``orz`` (math).
Each sub-command lives in its own module (``prepare_kk``, ``prepare_math``), which exposes
``add_arguments(parser)`` and ``run(args)``; ``--help`` on a sub-command lists its options.
"""

from __future__ import annotations

import argparse
import sys

from arlopti.config.cli_report import run_command


def build_parser() -> argparse.ArgumentParser:
    from arlopti.data import prepare_kk, prepare_math

    parser = argparse.ArgumentParser(prog="python -m arlopti.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="dataset", required=True)
    prepare_kk.add_arguments(sub.add_parser("kk", help="Knights-and-Knaves train/test sets"))
    for name in prepare_math.DATASETS:
        p = sub.add_parser(name, help=f"{name} math prompt set")
        prepare_math.add_arguments(p, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    from arlopti.data import prepare_kk, prepare_math

    args = build_parser().parse_args(argv)
    if args.dataset == "kk":
        return prepare_kk.run(args) or 0
    return prepare_math.run(args) or 0


if __name__ == "__main__":
    sys.exit(run_command(main))
