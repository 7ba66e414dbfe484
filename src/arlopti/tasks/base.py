"""What a task is: a reward over decoded responses, and the metrics built on that reward.

The learner never sees task code: the rollout callback (and validation, and ``eval.py``) look a
task up by the name each prompt record carries (``PromptRecord.task``) with :func:`get_task`,
call :meth:`Task.score` and hand the learner plain rewards. A task's options come from the
config's ``tasks.<name>`` node (its constructor's keyword arguments, checked at start-up by
:func:`check_task_options`).

A new task needs no file under ``src/``: a reward function given by path and a prompt file,
``task=custom task.reward_fn=my_rewards.py:score data=prompts data.train_file=train.jsonl``
(:mod:`arlopti.tasks.custom`, :mod:`arlopti.data.generic_datamodule`; the walk-through is
``docs/custom_task.md``). The built-in tasks ``kk`` and ``math`` (and ``custom``) are
:class:`Task` subclasses decorated with :func:`register_task` in modules that
``arlopti/tasks/__init__.py`` imports; a :class:`Task` subclass of your own registers the same
way, in a module imported before ``arlopti.entry.train.train`` runs (a wrapper script of yours).
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
    """Class decorator: ``get_task(name, **options)`` builds this task."""

    def deco(factory):
        _TASKS[name] = factory
        return factory

    return deco


def get_task(name: str, **kwargs) -> Task:
    """A new instance of the task registered as ``name``, built with ``kwargs``; KeyError lists the
    registered names."""
    if name not in _TASKS:
        # Import the built-in tasks lazily so that registering them costs nothing up front.
        import arlopti.tasks  # noqa: F401  (registers kk and math)
    if name not in _TASKS:
        raise KeyError(f"task={name!r} is not registered; known tasks: {sorted(_TASKS)}")
    return _TASKS[name](**kwargs)


def check_task_options(options: Mapping[str, Mapping[str, Any] | None] | None,
                       required: tuple[str, ...] = ()) -> None:
    """Build each configured task once (``tasks.<name>`` -> its constructor's keyword arguments)
    so that a bad option fails at start-up with :class:`~arlopti.config.ConfigError` naming the
    key, not at the first reward. Tasks start no worker before their first call.

    A ``null`` entry is a task that is not configured (``tasks.custom`` without ``task=custom``)
    and is skipped, unless its name is in ``required`` (the tasks the data's records name), which
    are built with their options (none: ``{}``) whether listed or not. A task's own
    :class:`~arlopti.config.ConfigError` passes through unchanged (it names its ``task.*`` key)."""
    from arlopti.config import ConfigError

    options = dict(options or {})
    names = [n for n, kw in options.items() if kw is not None] + [n for n in required
                                                                   if n and options.get(n) is None]
    for name in names:
        kwargs = dict(options.get(name) or {})
        try:
            task = get_task(name, **kwargs)
        except KeyError as err:
            raise ConfigError(f"tasks.{name}: {err.args[0]}") from None
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:
            raise ConfigError(f"tasks.{name}={kwargs}: {err}") from None
        task.close()
