"""Tasks: K&K logic puzzles (``kk``), math with boxed answers (``math``) and a reward function of
your own (``custom``, :mod:`arlopti.tasks.custom`).

Importing this package registers all three with :func:`arlopti.tasks.base.get_task`.

Read first: :mod:`arlopti.tasks.base` (the task contract: prompts in, rewards out), then the task's own folder;
multi-turn environments are in :mod:`arlopti.tasks.env`.
"""

from arlopti.tasks import custom, kk, math  # noqa: F401  (registers the tasks)
from arlopti.tasks.base import RewardResult, Task, get_task, register_task

__all__ = ["RewardResult", "Task", "get_task", "register_task"]
