"""What the root scripts (``train.py``, ``eval.py``) check before Hydra composes."""

from __future__ import annotations

import sys


def command_line_overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides of a ``train.py`` / ``eval.py`` command line, as Hydra's own parser reads them."""
    try:
        from hydra._internal.utils import get_args_parser

        args, rest = get_args_parser().parse_known_args(argv)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports a bad command line itself
        return []
    return list(args.overrides or []) + [a for a in rest if not a.startswith("-")]


def check_command_line(argv: list[str]) -> None:
    """Refuse an override of the wrong type before Hydra composes (OmegaConf would turn
    ``algorithm.lopti.enabled=no`` into ``False``): exit 1 with the key, the value and the type."""
    from arlopti.config import ConfigError, check_overrides
    from arlopti.config.cli_report import one_line

    try:
        check_overrides(command_line_overrides(argv))
    except ConfigError as err:
        sys.exit(one_line(err))
