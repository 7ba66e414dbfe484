"""``python -m arlopti.analysis <command>``: the paper's mechanism figures on a real model.

Commands (each writes ``<out>/<name>.png`` and ``<out>/<name>.json``; ``--tb-dir`` also logs them to
TensorBoard):

* ``token-distribution`` Fig. 1a/b: the sampled tokens' probabilities and their advantages by bucket;
* ``grad-norms``        Fig. 1d and the (1 − p) bound: per-token and per-bucket gradient norms;
* ``prob-shift``        Fig. 1c/e/f: Δp per bucket after one update on all / low / high tokens;
* ``update-direction``  Fig. 3: fraction of tokens moved in their advantage's direction, GRPO/AR/Lopti;
* ``compare-methods``   GRPO, AR, Lopti, AR + Lopti and the token methods on one batch (:mod:`.compare_methods`);
* ``word-categories``   Fig. 5: reasoning-word categories vs reward over a rollout dump;
* ``dump``              sample a live batch and write it as a rollout dump (input of the others);
* ``reproduce``         all of the above into one folder (``make reproduce``: ``--out docs/figures``);
* ``study``             the study's old name: ``python -m arlopti.analysis study <part> ...`` is
  ``arlopti study <part> ...`` (:mod:`arlopti.study`), forwarded by name as the ``arlopti`` command does.

Inputs: a live batch sampled from ``--model`` (default SmolLM2-135M-Instruct, offline) after
``--cold-start-steps`` SFT steps (cached), or ``--dump`` (a rollout dump with token arrays).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

import torch

from arlopti.analysis.cli_args import add_input_args, add_method_args, add_update_args
from arlopti.analysis.commands import (cmd_compare_methods, cmd_dump, cmd_grad_norms, cmd_prob_shift,
                                       cmd_token_distribution, cmd_update_direction, cmd_word_categories)
from arlopti.config.cli_report import run_command

log = logging.getLogger("arlopti.analysis")

#: The study, above this package: ``study ...`` is handed to it by name (it imports the analysis, not the reverse).
STUDY = "arlopti.study.__main__"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m arlopti.analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("grad-norms", help="Fig. 1d: gradient norms by probability bucket")
    add_input_args(p)
    p.add_argument("--mode", choices=("per-token", "aggregate", "both"), default="both")
    p.add_argument("--max-tokens", type=int, default=200, help="per-token mode: tokens analysed (one backward each)")
    p.add_argument("--max-sequences", type=int, default=8, help="per-token mode: responses they are drawn from")
    p.add_argument("--layer", type=int, default=None, help="hidden-state layer (default: the middle one)")
    p = sub.add_parser("token-distribution", help="Fig. 1a/b: token probabilities and advantages by bucket")
    add_input_args(p)
    p = sub.add_parser("prob-shift", help="Fig. 1c/e/f: Δp after updating all / low / high tokens")
    add_input_args(p)
    add_update_args(p)
    p = sub.add_parser("update-direction", help="Fig. 3: update direction under GRPO, AR and Lopti")
    add_input_args(p)
    add_update_args(p)
    add_method_args(p)
    p.add_argument("--methods", default="grpo,ar,lopti", help="comma list of grpo, ar, lopti, ar_lopti")
    p = sub.add_parser("compare-methods", help="GRPO, AR, Lopti and the token methods side by side on one batch")
    add_input_args(p)
    add_update_args(p)
    add_method_args(p)
    p.add_argument("--methods", default=None,
                   help="comma list (default: all of arlopti.analysis.compare_methods.METHODS)")
    p.add_argument("--cov-ratio", type=float, default=0.02, help="Clip-Cov / KL-Cov share of tokens (verl: 2e-4)")
    p = sub.add_parser("word-categories", help="Fig. 5: word categories vs reward over a dump")
    add_input_args(p)
    p = sub.add_parser("dump", help="sample a live batch and write it as a rollout dump")
    add_input_args(p)
    p.add_argument("--file", default=None, help="dump file (default: <out>/rollouts_live.jsonl.gz)")
    p = sub.add_parser("reproduce", help="every figure into --out (make reproduce)")
    from arlopti.analysis.reproduce import add_reproduce_args

    add_reproduce_args(p)
    sub.add_parser("study", help="= arlopti study <part> (python -m arlopti.study): the seeded method study",
                   add_help=False)
    return parser


COMMANDS = {"token-distribution": cmd_token_distribution, "grad-norms": cmd_grad_norms, "prob-shift": cmd_prob_shift,
            "update-direction": cmd_update_direction, "compare-methods": cmd_compare_methods,
            "word-categories": cmd_word_categories, "dump": cmd_dump}


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["study"]:  # the study's old command line: the study by name, as the arlopti command runs it
        return importlib.import_module(STUDY).main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == "reproduce":
        from arlopti.analysis.reproduce import reproduce

        return reproduce(args)
    result = COMMANDS[args.command](args)
    files = result.get("files", {"file": result.get("file")})
    print(json.dumps({"command": args.command, "files": files}, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main))
