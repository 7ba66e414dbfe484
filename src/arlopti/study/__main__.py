"""``arlopti study <part>`` (= ``python -m arlopti.study <part>``; ``python -m arlopti.analysis study <part>``
is the same command under its old name): both camps of the low-probability-token question, one harness.

Parts (each writes into ``--out``, piece by piece, and a second call with the same ``--out`` reuses every
piece already there, so a study longer than one session is finished by calling it again):

* ``toy``: the controlled setting (:mod:`.toy`): every method x ``--seeds`` seeds, each a training run on the
  tiny model, then the tables and figures;
* ``kk-mechanism``, ``kk-run``, ``kk-report``: the paper's setting at CPU scale (:mod:`.kk`).

``--out`` defaults to ``study/toy`` or ``study/kk`` inside the run tree (``paths.log_dir``, ``logs/`` of the
checkout). Run heavy parts under the CPU lock of a shared machine (``flock <lock file> arlopti study ...``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger("arlopti.study")

#: Each part's folder under ``<paths.log_dir>/study`` when ``--out`` is not given.
DEFAULT_FOLDER = {"toy": "toy", "kk-mechanism": "kk", "kk-run": "kk", "kk-report": "kk"}
OUT_HELP = "output folder (default: <paths.log_dir>/study/{}, inside the run tree)"


def add_toy_args(sub) -> None:
    t = sub.add_parser("toy", help="the controlled setting: the tiny model on the first-half task")
    t.add_argument("--out", default=None, help=OUT_HELP.format("toy"))
    t.add_argument("--methods", default=None, help="comma list of experiment names kk_<name> (default: all; "
                                                    "GRPO is always added)")
    t.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1, the same for every method")
    t.add_argument("--steps", type=int, default=30, help="rollout steps per run")
    t.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate of the runs")
    t.add_argument("--warm-start-steps", type=int, default=100, help="SFT steps before RL (0: the plain toy task)")
    t.add_argument("--threshold", type=float, default=0.6, help="reward of the steps-to-threshold column")
    t.add_argument("--final-window", type=int, default=5, help="last steps averaged into the final reward")
    t.add_argument("--workers", type=int, default=2, help="processes running the runs")
    t.add_argument("--threads", type=int, default=1, help="torch threads per process")
    t.add_argument("--skip-mechanism", action="store_true", help="no first-step compare-methods per seed")


def add_kk_args(sub) -> None:
    m = sub.add_parser("kk-mechanism", help="every method's first update on the same SmolLM2 K&K batches")
    m.add_argument("--out", default=None, help=OUT_HELP.format("kk"))
    m.add_argument("--methods", default=None, help="comma list of experiment names (default: all)")
    m.add_argument("--model", default="smollm2-135m-instruct")
    m.add_argument("--batches", type=int, default=3, help="batches measured by this call")
    m.add_argument("--first-batch", type=int, default=0, help="index of the first (its sampling seed)")
    m.add_argument("--prompts", type=int, default=2, help="K&K prompts per batch")
    m.add_argument("--group-size", type=int, default=4)
    m.add_argument("--max-new-tokens", type=int, default=64)
    m.add_argument("--temperature", type=float, default=0.7)
    m.add_argument("--micro-batch", type=int, default=8)
    m.add_argument("--threads", type=int, default=None)
    r = sub.add_parser("kk-run", help="one learning-pilot run: arlopti train experiment=kk_lopti_demo, then eval")
    r.add_argument("--out", default=None, help=OUT_HELP.format("kk"))
    r.add_argument("--method", required=True, help="experiment name kk_<method>")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--val-per-n", type=int, default=32, help="validation puzzles per N (2 and 3 people)")
    r.add_argument("--keep-checkpoint", action="store_true", help="keep the run's last.ckpt after the evaluation")
    r.add_argument("--threads", type=int, default=None)
    p = sub.add_parser("kk-report", help="tables and figures of the K&K mechanism and pilot in --out")
    p.add_argument("--out", default=None, help=OUT_HELP.format("kk"))
    p.add_argument("--threads", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arlopti study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    add_toy_args(sub)
    add_kk_args(sub)
    return parser


def default_out(part: str) -> Path:
    """``<paths.log_dir>/study/<toy|kk>``: the run tree's folder of the part (the composed ``paths.log_dir``)."""
    from arlopti.config.compose import compose

    return Path(compose().paths.log_dir) / "study" / DEFAULT_FOLDER[part]


def portable_path(text: str, root: Path | None = None) -> str:
    """A path as a recorded command may show it: relative to the checkout (``root``, default this one's) when
    it lies inside it, ``<path>`` when it is an absolute path elsewhere (no machine path in docs/figures/),
    else unchanged."""
    root = Path(__file__).resolve().parents[3] if root is None else Path(root)
    path = Path(text)
    full = path.resolve() if path.is_absolute() or path.exists() else None
    if full is not None and full.is_relative_to(root.resolve()):
        return str(full.relative_to(root.resolve())) or "."
    return "<path>" if path.is_absolute() else text


def portable_command(words: list[str], root: Path | None = None) -> str:
    """``words`` joined into the command study.json and tables.md record, each path through
    :func:`portable_path` (``--out=/x`` too)."""
    out = []
    for w in words:
        key, eq, value = w.partition("=") if w.startswith("--") else ("", "", w)
        if eq:
            out.append(f"{key}={portable_path(value, root)}")
        else:
            out.append(w if w.startswith("-") else portable_path(w, root))
    return " ".join(out)


def run_part(args) -> dict:
    """Run ``args.part`` (its options already checked)."""
    if args.part == "toy":
        from arlopti.study.toy import toy_study

        return toy_study(args)
    if args.part == "kk-mechanism":
        from arlopti.study.kk_mechanism import kk_mechanism

        return kk_mechanism(args)
    if args.part == "kk-run":
        from arlopti.study.kk import kk_pilot_run

        return {"files": kk_pilot_run(args.method, args.seed, args.out, args.val_per_n,
                                      keep_checkpoint=args.keep_checkpoint)}
    from arlopti.study.kk_report import kk_report

    return kk_report(args)


def main(argv: list[str] | None = None) -> dict:
    from arlopti.study.checks import check_study_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = portable_command(["arlopti", "study", *argv])  # what study.json records
    check_study_args(args)  # before anything runs, --threads included
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.out is None:
        args.out = str(default_out(args.part))
        log.info("study %s: --out %s", args.part, args.out)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = run_part(args)
    print(json.dumps({"command": f"study {args.part}", "files": result.get("files")}, indent=1, default=str))
    return result


if __name__ == "__main__":
    from arlopti.config.cli_report import run_command

    sys.exit(run_command(main))
