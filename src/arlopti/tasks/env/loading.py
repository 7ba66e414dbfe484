"""Finding the environment of a run: ``task.env`` and ``arlopti.run(env=...)``.

``task.env`` names a class (or any zero-argument callable returning an environment, as TRL's
``environment_factory``) the way ``task.reward_fn`` names a function (:mod:`arlopti.tasks.user_code`):
``path/to/file.py:Class`` (the file relative to the current directory) or ``module.path:Class``; a
class handed to :func:`arlopti.run` in Python is kept in the process under ``callable:<key>``
(:func:`register_env`, :mod:`arlopti.tasks.in_process`). :func:`load_env` imports it and builds one
probe instance, as TRL probes its factory, to tell the contract (:func:`arlopti.tasks.env.base.is_text_env`)
and read the tools' schema; the probe is closed and never reset.

Where the episodes' instances live (:mod:`arlopti.rollout.env_calls`): in worker processes, one per
episode (:mod:`arlopti.tasks.env.workers`), for a spec a fresh interpreter can import by name
(:attr:`EnvSpec.worker_spec`: a file spec made absolute, a ``module:Class``, or a ``callable:`` class
defined at the top level of an importable module, :func:`arlopti.tasks.in_process.importable_spec`);
otherwise (a class defined in ``__main__``, a notebook, a function) in the trainer's process.

:func:`env_config` reads the environment's settings from the run's ``task`` node
(``configs/train.yaml``: the :class:`~arlopti.config.schema.EnvConfig` keys, beside ``task=custom``'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arlopti.config import ConfigError, check_fields, from_dict
from arlopti.config.schema import EnvConfig
from arlopti.tasks.env.base import EnvError, is_text_env

@dataclass(frozen=True)
class EnvSpec:
    """A loaded environment: its ``name`` (for messages and metrics), the ``factory`` that builds one
    instance per episode, whether it follows the text contract (``text``; else TRL's), its tools'
    JSON schema (``tools``; empty for a text environment), its ``turn_prefix``, whether it has a
    ``get_reward`` method (``has_reward``) and the spec a worker process imports it by (``worker_spec``;
    None: it runs in the trainer's process, module docstring)."""

    name: str
    factory: Callable[[], Any]
    text: bool
    tools: list[dict] = field(default_factory=list)
    turn_prefix: str = ""
    has_reward: bool = False
    worker_spec: str | None = None


def register_env(env: Callable) -> str:
    """The ``task.env`` spec ``callable:<key>`` under which the class ``env`` is kept in this process."""
    from arlopti.tasks.in_process import register_callable

    if not callable(env):
        raise TypeError(f"env: expected a class (or a zero-argument callable returning an environment), got "
                        f"{type(env).__name__}")
    return register_callable(env)


def _factory(spec: str) -> Callable:
    from arlopti.tasks.in_process import is_callable_spec, lookup
    from arlopti.tasks.user_code import UserCodeError, load_function, resolve_spec

    try:
        return lookup(spec) if is_callable_spec(spec) else load_function(resolve_spec(spec))
    except (UserCodeError, KeyError) as err:
        raise ConfigError(f"task.env={spec}: {err.args[0]}") from None


def worker_spec(spec: str, factory: Callable) -> str | None:
    """The spec a fresh interpreter imports ``spec``'s class by (module docstring), or None."""
    from arlopti.tasks.in_process import importable_spec, is_callable_spec
    from arlopti.tasks.user_code import resolve_spec

    return importable_spec(factory) if is_callable_spec(spec) else resolve_spec(spec)


def load_env(spec: str) -> EnvSpec:
    """Import ``spec`` and probe one instance (module docstring). Bad input is a
    :class:`~arlopti.config.ConfigError` naming ``task.env``; a tool without a usable schema an
    :class:`~arlopti.tasks.env.base.EnvError` naming the method."""
    from arlopti.tasks.env.tools import tool_schemas

    factory = _factory(spec)
    name = getattr(factory, "__qualname__", getattr(factory, "__name__", type(factory).__name__))
    try:
        probe = factory()
    except Exception as err:  # noqa: BLE001 - user code
        raise ConfigError(f"task.env={spec}: building an instance with no argument failed "
                          f"({type(err).__name__}: {err}); one instance is built per episode, as Cls()") from None
    cls = type(probe)
    if not callable(getattr(probe, "reset", None)):
        raise ConfigError(f"task.env={spec}: {cls.__name__} has no reset method; an environment needs "
                          "reset(row) and step(text) (the text contract) or reset(**row) and tools (TRL's)")
    text = is_text_env(cls)
    try:
        tools = [] if text else tool_schemas(probe)
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            close()
    prefix = getattr(cls, "turn_prefix", "")
    if not isinstance(prefix, str):
        raise ConfigError(f"task.env={spec}: {cls.__name__}.turn_prefix must be a string, got {type(prefix).__name__}")
    if not text and not tools:
        raise EnvError(f"task.env={spec}: {cls.__name__} has no step(text) method (the text contract) and no public "
                       "method to call as a tool (TRL's contract): the model could never act on it")
    return EnvSpec(name=name, factory=factory, text=text, tools=tools, turn_prefix=prefix,
                   has_reward=callable(getattr(probe, "get_reward", None)), worker_spec=worker_spec(spec, factory))


def env_config(node: Mapping[str, Any] | None) -> EnvConfig:
    """The environment's settings of the run's ``task`` node (``configs/train.yaml``: the
    :class:`~arlopti.config.schema.EnvConfig` keys; ``task=custom``'s reward keys beside them are the
    custom task's, ``${custom_task:...}``), checked as the schema says."""
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    env = from_dict(EnvConfig, {k: v for k, v in dict(node or {}).items() if k in names}, "task")
    check_fields(env, "task")
    return env


__all__ = ["EnvSpec", "env_config", "load_env", "register_env", "worker_spec"]
