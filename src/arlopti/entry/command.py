"""The ``arlopti`` command: one console script, a subcommand per entry point (TRL's ``trl <verb>`` habit).

    arlopti --help                       # the subcommands
    arlopti train experiment=kk_lopti    # = python train.py experiment=kk_lopti
    arlopti eval model=... eval=kk_suite # = python eval.py ...
    arlopti export <ckpt> <out_dir>      # = python -m arlopti.checkpoints.export <ckpt> <out_dir>
    arlopti <subcommand> --help          # that subcommand's own help

Each subcommand runs the entry point it names, unchanged: ``train`` and ``eval`` run the repository's
``train.py`` / ``eval.py`` (Hydra's command line and ``--multirun``; ``--help`` is
:mod:`arlopti.entry.help`'s page), the others call their module's ``main(argv)`` through
:func:`arlopti.config.cli_report.run_command`, so a bad setting is one line and exit status 1 under
every subcommand, as under ``python -m``. Their help and usage lines name the command as it was typed,
``arlopti <sub>``, and show the modules' docstrings without their reST markup (:func:`named_as`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

#: subcommand -> (what it runs, one line of help). A module's ``main(argv)``, or a root script.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train.py", "train a policy (Hydra overrides: experiment=..., task=..., ...)"),
    "eval": ("eval.py", "evaluate a model or a checkpoint on the K&K / math suites"),
    "export": ("arlopti.checkpoints.export", "export a run's checkpoint as a Hugging Face model folder"),
    "serve": ("arlopti.rollout.serve", "start a rollout server worker (vLLM) for placement=server"),
    "analysis": ("arlopti.analysis.__main__", "the paper's figures and analyses from run folders"),
    "study": ("arlopti.study.__main__", "the seeded method study (toy, K&K) over training runs"),
    "prepare": ("arlopti.data.prepare", "prepare the K&K and math data files"),
    "preview": ("arlopti.data.preview", "show the prompts a data config produces"),
    "compare": ("arlopti.eval.compare", "compare the evaluation results of exactly two runs, A and B, item by item"),
    "demo-record": ("arlopti.entry.demo_record", "record a demo run's summary into README's table"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return ("usage: arlopti <subcommand> [arguments]   (arlopti <subcommand> --help for its own)\n\n"
            "subcommands:\n" + "\n".join(lines))


#: reST roles (``:func:`x```) and literals (````x````) of the modules' docstrings, which argparse prints as written.
_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr|obj|exc):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_help(text: str) -> str:
    """``text`` (an argparse help or usage) naming every command as ``arlopti <sub>`` instead of ``python -m
    <module>``, the root scripts as ``arlopti train`` / ``arlopti eval``, without reST markup."""
    for sub, (target, _) in sorted(SUBCOMMANDS.items(), key=lambda item: -len(item[1][0])):  # longest name first
        text = text.replace(f"python -m {target.removesuffix('.__main__')}", f"arlopti {sub}")
    text = text.replace("python train.py", "arlopti train").replace("python eval.py", "arlopti eval")
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.M)


def _plain_parser(parser: argparse.ArgumentParser) -> None:
    """The parser's name, description, epilog and argument help (a subcommand's line too) through
    :func:`plain_help`, before argparse lays them out (so that its wrapping and indentation fit the new text)."""
    parser.prog = plain_help(parser.prog)
    for attr in ("description", "epilog"):
        if getattr(parser, attr):
            setattr(parser, attr, plain_help(getattr(parser, attr)))
    for action in parser._actions:
        for each in (action, *getattr(action, "_choices_actions", ())):
            if isinstance(each.help, str):
                each.help = plain_help(each.help)


@contextlib.contextmanager
def named_as() -> Iterator[None]:
    """While a subcommand's ``main`` runs, every argparse help and usage it prints names the commands as
    ``arlopti <sub>`` and has no reST markup (:func:`plain_help`; the modules build their parsers inside ``main``)."""
    saved = argparse.ArgumentParser.format_help, argparse.ArgumentParser.format_usage

    def format_help(parser):
        _plain_parser(parser)
        return saved[0](parser)

    def format_usage(parser):
        _plain_parser(parser)
        return saved[1](parser)

    argparse.ArgumentParser.format_help, argparse.ArgumentParser.format_usage = format_help, format_usage
    try:
        yield
    finally:
        argparse.ArgumentParser.format_help, argparse.ArgumentParser.format_usage = saved


def repo_root() -> Path:
    """The repository holding ``train.py``, ``eval.py`` and ``configs/`` (this package is installed from it
    with ``pip install -e .``, as ``make install`` does)."""
    return Path(__file__).resolve().parents[3]


def _run_script(name: str, argv: list[str]) -> int:
    script = repo_root() / name
    if not script.is_file():
        print(f"arlopti: {name} not found at {script}: `arlopti train` / `arlopti eval` run the repository's "
              "scripts; install the package from its checkout (pip install -e ., as make install does)",
              file=sys.stderr)
        return 1
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:  # Hydra's main and the one-line failures end with sys.exit
        return _status(done)
    finally:
        sys.argv = saved
    return 0


def _status(done: SystemExit) -> int:
    """The exit status a ``SystemExit`` carries (a message printed by ``sys.exit("...")`` is 1)."""
    if isinstance(done.code, int):
        return done.code
    if done.code is not None:
        print(done.code, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"arlopti: unknown subcommand {name!r}; choose one of {', '.join(SUBCOMMANDS)} (arlopti --help)",
              file=sys.stderr)
        return 2
    target = SUBCOMMANDS[name][0]
    if target.endswith(".py"):
        return _run_script(target, rest)
    from arlopti.config.cli_report import run_command

    try:
        with named_as():
            return run_command(importlib.import_module(target).main, rest)
    except SystemExit as done:  # argparse's --help and usage errors
        return _status(done)


__all__ = ["SUBCOMMANDS", "main", "named_as", "plain_help", "repo_root", "usage"]
