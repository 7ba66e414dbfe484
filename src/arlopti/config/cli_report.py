"""How a command line reports a refused configuration: one line on stderr, exit status 1.

Every ``python -m arlopti...`` command and ``train.py`` / ``eval.py`` show a :class:`ConfigError`
the same way, ``ConfigError: <message>``, with no traceback; ``HYDRA_FULL_ERROR=1`` raises it
instead (Hydra's switch for the whole report, kept for every command so there is one switch).
It lives here, next to :class:`ConfigError`, because the commands sit in several layers (data/,
analysis/, checkpoints/, eval/, entry/) and may import only downwards; ``entry/failures.py``
builds train.py's and eval.py's report on the same two functions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from arlopti.config.schema import ConfigError


def full_error() -> bool:
    """Whether the user asked for the full error report (``HYDRA_FULL_ERROR=1``, as Hydra reads it)."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def one_line(err: BaseException) -> str:
    """``<ErrorType>: <message>``, what the console shows of a failure."""
    return f"{type(err).__name__}: {err}"


def run_command(main: Callable[[list[str] | None], Any], argv: list[str] | None = None) -> int:
    """Run a command's ``main(argv)`` and return its exit status for ``sys.exit``: ``main``'s own when
    it returns an int, else 0; a :class:`ConfigError` prints :func:`one_line` and gives 1."""
    try:
        result = main(argv)
    except ConfigError as err:
        if full_error():
            raise
        print(one_line(err), file=sys.stderr, flush=True)
        return 1
    return result if isinstance(result, int) else 0


__all__ = ["full_error", "one_line", "run_command"]
