"""What a task is: a prompt builder, a reward, and the metrics built on that reward.

Adding a task means adding one folder under ``arlopti/tasks/`` with a :class:`Task` subclass and
registering it with :func:`register_task`. The learner never sees task code: the rollout callback
calls :meth:`Task.score` and hands the learner plain rewards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class RewardResult:
    """The score of one response.

    ``reward`` is what GRPO optimises. ``correct`` is the task's notion of a solved sample
    (K&K: reward == 3; math: reward == 1). ``components`` holds named parts for metrics,
    e.g. ``{"format_ok": 1.0, "answer_score": -1.5}``.
    """

    reward: float
    correct: bool
    components: dict[str, float] = field(default_factory=dict)


class Task(ABC):
    """A task scores decoded responses against a sample's ground truth."""

    name: str = "task"

    @abstractmethod
    def score(self, responses: list[str], ground_truths: list[Any], metas: list[dict]) -> list[RewardResult]:
        """Score ``responses[i]`` against ``ground_truths[i]``. Never raises, never hangs."""

    def close(self) -> None:
        """Release worker processes, if any."""


_TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    def deco(factory):
        _TASKS[name] = factory
        return factory

    return deco


def get_task(name: str, **kwargs) -> Task:
    if name not in _TASKS:
        # Import the built-in tasks lazily so that registering them costs nothing up front.
        import arlopti.tasks  # noqa: F401  (registers kk and math)
    if name not in _TASKS:
        raise KeyError(f"task={name!r} is not registered; known tasks: {sorted(_TASKS)}")
    return _TASKS[name](**kwargs)


def check_task_options(options: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Build each configured task once (``tasks.<name>`` -> its constructor's keyword arguments)
    so that a bad option fails at start-up with :class:`~arlopti.config.ConfigError` naming the
    key, not at the first reward. Tasks start no worker before their first call."""
    from arlopti.config import ConfigError

    for name, kwargs in (options or {}).items():
        try:
            task = get_task(name, **dict(kwargs or {}))
        except KeyError as err:
            raise ConfigError(f"tasks.{name}: {err.args[0]}") from None
        except (TypeError, ValueError) as err:
            raise ConfigError(f"tasks.{name}={dict(kwargs or {})}: {err}") from None
        task.close()
