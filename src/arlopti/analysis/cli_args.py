"""Command-line options shared by ``python -m arlopti.analysis`` and its ``reproduce`` command.

A light module (argparse only), so that ``--help`` stays fast; the commands themselves are in
:mod:`arlopti.analysis.commands`. AR's α and Lopti's η are not written here: left out, they are
``algorithm=ar_lopti``'s (:func:`paper_settings`), so the paper's values live in the algorithm config alone.
"""

from __future__ import annotations

import argparse
import functools


def add_input_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs")
    g.add_argument("--model", default="smollm2-135m-instruct",
                   help="model name or save_pretrained folder (default: %(default)s)")
    g.add_argument("--cold-start-steps", type=int, default=10,
                   help="SFT warm-up steps before sampling (cached by settings; default %(default)s, short like "
                        "the CPU demo's); 0 = the raw model")
    g.add_argument("--prompts", type=int, default=8, help="K&K prompts in the batch")
    g.add_argument("--group-size", type=int, default=4, help="responses per prompt")
    g.add_argument("--max-new-tokens", type=int, default=96)
    g.add_argument("--temperature", type=float, default=0.7, help="rollout temperature (also of every log-prob)")
    g.add_argument("--num-people", type=int, nargs="+", default=[2, 3])
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    g.add_argument("--puzzle-seed", type=int, default=4242, help="seed of the generated puzzles")
    g.add_argument("--advantages", choices=("auto", "grpo", "synthetic"), default="auto",
                   help="auto: GRPO when some group's rewards vary, else synthetic ±1 per sequence (labelled)")
    g.add_argument("--dump", default=None, help="read the batch from this rollout dump instead of sampling")
    g.add_argument("--dump-step", type=int, default=None, help="which step of the dump (default: the first)")
    g.add_argument("--micro-batch", type=int, default=4, help="rows per forward/backward")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--out", default="analysis_out", help="output folder (default: %(default)s)")
    g.add_argument("--tb-dir", default=None, help="also log scalars and figures to this TensorBoard folder")


#: The update commands' learning rate per optimizer when ``--lr`` is not given.
DEFAULT_LR = {"sgd": 0.01, "adamw": 1e-5}


def add_update_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default: {DEFAULT_LR['sgd']} for sgd, {DEFAULT_LR['adamw']} for adamw)")
    p.add_argument("--grad-clip", type=float, default=None, help="clip the global grad norm (default: off)")


#: The algorithm config whose AR α and Lopti η the commands use when ``--alpha`` / ``--eta`` are left out.
PAPER_ALGORITHM = "ar_lopti"


def add_method_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=None,
                   help=f"AR α (default: algorithm={PAPER_ALGORITHM}'s algorithm.ar_alpha, the paper's Fig. 3 value)")
    p.add_argument("--eta", type=float, default=None,
                   help=f"Lopti η (default: algorithm={PAPER_ALGORITHM}'s algorithm.lopti.eta, the paper's Fig. 3 value)")


@functools.lru_cache(maxsize=None)
def paper_settings(config_dir=None) -> tuple[float, float]:
    """``(α, η)``: ``algorithm.ar_alpha`` and ``algorithm.lopti.eta`` of ``algorithm=ar_lopti``, composed
    (configs/algorithm/ar_lopti.yaml, whose η is the schema's default)."""
    from arlopti.config.compose import compose

    algo = compose([f"algorithm={PAPER_ALGORITHM}"], config_dir=config_dir).algorithm
    return float(algo.ar_alpha), float(algo.lopti.eta)


def fill_method_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--alpha`` / ``--eta`` left out (None) set to :func:`paper_settings`'s."""
    if getattr(args, "alpha", 0.0) is None or getattr(args, "eta", 0.0) is None:
        alpha, eta = paper_settings()
        args.alpha = alpha if args.alpha is None else args.alpha
        args.eta = eta if args.eta is None else args.eta
    return args
