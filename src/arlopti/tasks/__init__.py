"""Tasks: K&K logic puzzles (``kk``) and math with boxed answers (``math``).

Importing this package registers both with :func:`arlopti.tasks.base.get_task`.
"""

from arlopti.tasks import kk, math  # noqa: F401  (registers the tasks)
from arlopti.tasks.base import RewardResult, Task, get_task, register_task

__all__ = ["RewardResult", "Task", "get_task", "register_task"]
