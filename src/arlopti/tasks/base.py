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

    def place(self, device, precision: str) -> None:
        """Where the run computes (:func:`trainer_placement`): a task that runs a model of its own
        (``task.reward_model``, :mod:`arlopti.tasks.reward_model`) puts it there; the others ignore it.
        The callbacks call it once, right after building the task."""


def trainer_placement(trainer) -> tuple[Any, str] | None:
    """``(device, precision)`` for :meth:`Task.place`: the trainer's device (``trainer.strategy.root_device``:
    this rank's) and its compute precision, Lightning's ``trainer.precision`` or, when the FSDP2 strategy
    casts the parameters itself (``trainer=fsdp_bf16``, under ``32-true``), ``<mixed_precision>-mixed``.
    None for a stand-in without a strategy's device (tests): the task keeps its own defaults."""
    strategy = getattr(trainer, "strategy", None)
    if getattr(strategy, "root_device", None) is None:
        return None
    mixed = getattr(getattr(strategy, "fsdp_options", None), "mixed_precision", None)
    return strategy.root_device, f"{mixed}-mixed" if mixed else str(trainer.precision)


def with_prompt(meta: Mapping[str, Any] | None, messages: list[dict] | None, text: str) -> dict:
    """The ``meta`` a task scores a response with: the record's meta plus ``prompt``, the prompt's chat
    messages (or its text, for a raw-text record), as a multi-turn environment's row has it
    (:func:`arlopti.rollout.turns.episode_prompts`); ``prompt`` wins over a column of that name.
    A reward model or a judge (:mod:`arlopti.tasks.reward_model`, :mod:`arlopti.tasks.judge`) reads it."""
    return {**dict(meta or {}), "prompt": [dict(m) for m in messages] if messages is not None else text}


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
