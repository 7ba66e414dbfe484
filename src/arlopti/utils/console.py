"""A quiet, single console: what ``train.py`` and ``eval.py`` call once, after Hydra has set up logging.

Why each Lightning line printed twice: importing ``lightning`` attaches its own
``StreamHandler`` (format ``"INFO: ..."``) to the ``lightning`` logger (``lightning/__init__.py``,
and to ``lightning.pytorch`` / ``lightning.fabric`` when the root logger had no handler at import
time), while the record also propagates to the root logger, which Hydra gives a console handler
and the ``train.log`` file handler (``hydra/job_logging: default``). :func:`route_lightning_logs`
removes Lightning's own stream handlers so that each record is printed once, in Hydra's format,
and also reaches ``train.log``.

What is filtered, each at its source (a logger name or a warning's module and message), and why:

* Lightning's adverts, the ``"💡 Tip: ..."`` lines for litlogger / litmodels
  (``logger_connector.py``, ``callback_connector.py``): not about this run.
* ``lightning.pytorch.utilities._pytree``: ``isinstance(treespec, LeafSpec) is deprecated``, a
  deprecation inside Lightning about a torch API; nothing a user of this template can change.
* ``lightning.pytorch.loops.fit_loop``: ``Found N module(s) in eval mode``: the frozen reference
  policy is in eval mode on purpose.

One Lightning line is corrected rather than dropped (:class:`FitStopReason`): when ``rollout_steps``
or a preemption signal ends the run mid-epoch, Lightning still counts the cut epoch as done and
prints "`Trainer.fit` stopped: `max_epochs=1` reached."; it then says ``rollout_steps=N`` instead,
or nothing after a signal (the checkpoint callback has said why). The callbacks that know the
trainer register it with :func:`watch_fit_stop`.

Third-party progress bars (transformers' "Loading weights", the hub's downloads) are off
(:func:`quiet_download_bars`): they sat between the step lines. ``HF_HUB_DISABLE_PROGRESS_BARS=0``
keeps them.

Every other warning stays, so do all of this project's warnings.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
import weakref

#: (module regex, message regex) of the warnings filtered at their source; see the module docstring.
IGNORED_WARNINGS = (
    (r"lightning\.pytorch\.utilities\._pytree", r".*LeafSpec.* is deprecated"),
    (r"lightning\.pytorch\.loops\.fit_loop", r"Found \d+ module\(s\) in eval mode"),
)

#: Start of the messages dropped from Lightning's loggers (its adverts).
ADVERT_PREFIXES = ("💡 Tip:",)

_LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


class CurrentStdout:
    """A stream that writes to whatever ``sys.stdout`` is *now*. Hydra's console handler keeps the
    ``sys.stdout`` of start-up; the rich progress bar (in a terminal) swaps ``sys.stdout`` for a
    proxy that prints above the bar, and log lines written through this reach that proxy instead
    of being drawn into the bar's line."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


#: Loggers whose records the console prints bare (no ``[time][name][LEVEL] - `` prefix of about
#: 50 characters): the step line, so that its compact form fits an 80-column terminal. ``train.log``
#: keeps the full prefix.
BARE_CONSOLE_LOGGERS = ("arlopti.progress",)


class BareStepLines(logging.Formatter):
    """The console's formatter: records of :data:`BARE_CONSOLE_LOGGERS` as their message alone,
    every other record through the formatter the handler had (Hydra's)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.name in BARE_CONSOLE_LOGGERS:
            return record.getMessage()
        return self.inner.format(record)


class DropAdverts(logging.Filter):
    """Drops a record whose message starts with one of :data:`ADVERT_PREFIXES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(ADVERT_PREFIXES)


_MAX_EPOCHS_LINE = re.compile(r"^`Trainer\.fit` stopped: `max_epochs=\d+` reached\.$")
_fit_trainer: weakref.ref | None = None


def watch_fit_stop(trainer) -> None:
    """Let :class:`FitStopReason` read ``trainer`` (the run being fitted) when Lightning says why it stopped."""
    global _fit_trainer
    _fit_trainer = weakref.ref(trainer)


def fit_stop_reason(trainer) -> str | None:
    """What ended a fit that our code stopped (``trainer.should_stop``): ``rollout_steps=N`` when the
    learner reached it, ``""`` after a preemption signal, None when the stop was not ours."""
    module = getattr(trainer, "lightning_module", None) if trainer is not None else None
    if module is None or not getattr(trainer, "should_stop", False):
        return None
    if getattr(module, "preempted", False):
        return ""
    total = getattr(module, "total_rollout_steps", None)
    if total is not None and int(getattr(module, "rollout_step", 0)) >= int(total):
        return f"rollout_steps={int(total)}"
    return None


class FitStopReason(logging.Filter):
    """Rewrites Lightning's "`max_epochs=N` reached" when that is not why the fit stopped (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _fit_trainer is None or not _MAX_EPOCHS_LINE.match(str(record.getMessage())):
            return True
        reason = fit_stop_reason(_fit_trainer())
        if reason is None:
            return True
        record.msg, record.args = f"`Trainer.fit` stopped: `{reason}` reached.", ()
        return bool(reason)


def route_lightning_logs() -> None:
    """Print each Lightning log record once: when the root logger has handlers (Hydra's console
    and ``train.log``), remove Lightning's own stream handlers and let its records propagate; in
    any case drop its adverts and correct its fit-stop line (:class:`FitStopReason`). Also points
    the root's stdout handler at :class:`CurrentStdout` and prints step lines there without Hydra's
    prefix (:class:`BareStepLines`). Idempotent."""
    root = logging.getLogger()
    root_has_handlers = bool(root.handlers)
    for h in root.handlers:  # Hydra's console handler follows sys.stdout (the progress bar's proxy)
        if type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.__stdout__):
            h.setStream(CurrentStdout())
            if not isinstance(h.formatter, BareStepLines):
                h.setFormatter(BareStepLines(h.formatter))
    for name in _LIGHTNING_LOGGERS:
        lg = logging.getLogger(name)
        if root_has_handlers:
            for h in list(lg.handlers):
                if type(h) is logging.StreamHandler:  # Lightning's own console handlers only
                    lg.removeHandler(h)
            lg.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, DropAdverts) for f in lg.filters):
            lg.addFilter(DropAdverts())
        if not any(isinstance(f, FitStopReason) for f in lg.filters):
            lg.addFilter(FitStopReason())


def filter_third_party_warnings() -> None:
    """Ignore exactly the warnings of :data:`IGNORED_WARNINGS` (by module and message)."""
    for module, message in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)


#: Hugging Face's own switch for its progress bars: "0" keeps them (:func:`quiet_download_bars`).
PROGRESS_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"


def quiet_download_bars() -> bool:
    """Turn off third-party progress bars (transformers' "Loading weights", the hub's downloads): the
    step line and the rollout-step bar are the run's progress. ``HF_HUB_DISABLE_PROGRESS_BARS=0`` keeps
    them (Hugging Face's own setting, docs/logging.md). Returns whether they were turned off."""
    if os.environ.get(PROGRESS_BARS_ENV) == "0":
        return False
    os.environ[PROGRESS_BARS_ENV] = "1"
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    return True


def quiet_console() -> None:
    """:func:`route_lightning_logs`, :func:`filter_third_party_warnings` and :func:`quiet_download_bars`."""
    route_lightning_logs()
    filter_third_party_warnings()
    quiet_download_bars()
