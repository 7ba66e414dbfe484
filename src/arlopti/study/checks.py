"""The numeric options of ``arlopti study <part>``, checked before anything runs.

argparse checks only the type: ``study toy --steps -1`` used to train a run, then stop in a traceback
(``the run stopped after 1 of -1 rollout steps``). :func:`check_study_args` refuses such a value at
the start with one line, ``ConfigError: --steps -1: ...`` (exit status 1, :mod:`arlopti.config.cli_report`),
naming the option, the bound and the fix. ``None`` (an option left at its "not given" default,
``--threads``) is not checked.
"""

from __future__ import annotations

import math

from arlopti.config import ConfigError

#: Per part: ``(option, lowest allowed value, what it is)``; a float bound is exclusive (> it), an int one
#: inclusive (>= it). ``--seeds`` needs 2 for a CI over seeds.
_BOUNDS: dict[str, tuple[tuple[str, int | float, str], ...]] = {
    "toy": (("seeds", 2, "seeds per method (a CI over seeds needs at least 2)"),
            ("steps", 1, "rollout steps per run"), ("lr", 0.0, "the AdamW learning rate"),
            ("warm_start_steps", 0, "SFT steps before RL (0: no warm start)"),
            ("final_window", 1, "steps averaged into the final reward"),
            ("workers", 1, "processes"), ("threads", 1, "torch threads per process")),
    "kk-mechanism": (("batches", 1, "batches measured"), ("first_batch", 0, "the first batch's index"),
                     ("prompts", 1, "prompts per batch"), ("group_size", 1, "responses per prompt"),
                     ("max_new_tokens", 1, "new tokens per response"), ("temperature", 0.0, "the sampling temperature"),
                     ("micro_batch", 1, "rows per forward/backward"), ("threads", 1, "torch threads")),
    "kk-run": (("seed", 0, "the run's seed"), ("val_per_n", 1, "validation puzzles per N"),
               ("threads", 1, "torch threads")),
    "kk-report": (("threads", 1, "torch threads"),),
}


def _refusal(option: str, value, low: int | float, what: str) -> str | None:
    """The one-line refusal of ``--option value``, or None when it is allowed."""
    flag = "--" + option.replace("_", "-")
    if isinstance(low, float):
        ok = math.isfinite(value) and value > low
        return None if ok else f"{flag} {value:g}: {what} must be a finite number > {low:g}; give a positive value"
    return None if value >= low else f"{flag} {value}: {what} must be >= {low}; give {flag} {max(low, 1)} or more"


def check_study_args(args) -> None:
    """Raise :class:`ConfigError` on the first numeric option of ``study <part>`` out of its range
    (module docstring); ``study toy`` also needs ``--threshold`` in [0, 1] (the reward's range) and
    ``--final-window`` <= ``--steps`` (the final reward is the mean of the last ``--final-window`` steps)."""
    for option, low, what in _BOUNDS.get(args.part, ()):
        value = getattr(args, option, None)
        problem = None if value is None else _refusal(option, value, low, what)
        if problem:
            raise ConfigError(problem)
    if args.part != "toy":
        return
    if not 0.0 <= args.threshold <= 1.0:  # also NaN
        raise ConfigError(f"--threshold {args.threshold:g}: the toy task's reward is in [0, 1], so a threshold "
                          "outside it is never (or always) reached; give e.g. --threshold 0.6")
    if args.final_window > args.steps:
        raise ConfigError(f"--final-window {args.final_window}: the final reward averages the last --final-window "
                          f"steps of --steps {args.steps}; give --final-window {args.steps} or less")


__all__ = ["check_study_args"]
