"""What became of one call run for a task: the result type shared by the worker pool
(:class:`arlopti.tasks.math.pool.WorkerPool`) and the in-process runner
(:class:`arlopti.tasks.in_process.InProcessRunner`).

Standard library only and importing nothing of ``arlopti``, so that both can import it without
``tasks.in_process`` reaching back into ``tasks.math`` (``tests/tasks/test_layering.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TaskOutcome:
    """What became of one task: ``status`` is ``"ok"``, ``"timeout"`` (``error="budget"`` when the
    run's ``budget_s``, :meth:`~arlopti.tasks.math.pool.WorkerPool.run`'s, cut it off, not its own
    timeout) or ``"error"``."""

    status: str
    value: Any = None
    error: str = ""
