"""What a user sees when a run fails: one line that says what to fix, exit status 1.

Hydra reports an exception escaping a job as ``Error executing job with overrides: [...]`` and a
traceback, before the message. :func:`cli_task` wraps the task function of ``train.py`` and
``eval.py`` so that the console shows only ``<ErrorType>: <message>`` and the process exits with
status 1; the traceback goes to the job's log file (``train.log`` / ``eval.log``) only.
``HYDRA_FULL_ERROR=1`` gives Hydra's full report instead, as Hydra documents.

In a ``--multirun`` a failed job must stay a failed job for the sweeper (the Optuna sweeper records
the trial as failed, the basic one reports it at the end) and must not stop the other jobs: the job
prints its line and raises :class:`JobFailed`, which Hydra prints as that one line
(a ``CompactHydraException``) when it reports the failure. :func:`arlopti.run` (``entry/api.py``)
raises the original exception itself, after the job, so that Hydra prints nothing. The line and the
``HYDRA_FULL_ERROR`` switch are :mod:`arlopti.config.cli_report`'s, which every other command uses too.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from hydra.errors import CompactHydraException

from arlopti.config.cli_report import full_error, one_line

log = logging.getLogger(__name__)


class JobFailed(CompactHydraException):
    """A multirun job that failed: its message is the job's one line (``line``, Hydra prints it alone)
    and where the sweep's summary is (``summary``)."""

    def __init__(self, line: str, summary: str | None = None):
        super().__init__(line + (f" (every job's result: {summary})" if summary else ""))
        self.line, self.summary = line, summary

    def __reduce__(self):  # a submitit job sends it back pickled
        return (type(self), (self.line, self.summary))


def record_traceback(err: BaseException) -> None:
    """Write ``err`` with its traceback to the log files only (not the console)."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "the run failed:", (),
                            (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def in_multirun() -> bool:
    """Whether this job is one of a ``--multirun``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def multirun_summary_path() -> str:
    """Where this multirun's summary is written (:mod:`arlopti.entry.multirun`)."""
    from hydra.core.hydra_config import HydraConfig

    return f"{HydraConfig.get().sweep.dir}/multirun_summary.md"


def cli_task(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``task`` for ``@hydra.main``, reporting a failure as one line (module docstring)."""

    @functools.wraps(task)  # Hydra names the job (train.log) after the wrapped function's file
    def run(cfg):
        try:
            return task(cfg)
        except Exception as err:  # noqa: BLE001 - every error gets the same report
            if full_error():
                raise
            record_traceback(err)
            line = one_line(err)
            print(line, file=sys.stderr, flush=True)
            if in_multirun():
                raise JobFailed(line, multirun_summary_path()) from None
            sys.exit(1)

    return run


__all__ = ["JobFailed", "cli_task", "full_error", "in_multirun", "one_line", "record_traceback"]
