"""Environments for multi-turn episodes (``task.env``; docs/multi_turn.md).

* :mod:`arlopti.tasks.env.base`: the two contracts, the text one (:class:`TextEnv`) and TRL's
  ``environment_factory`` one (:class:`ToolEnv`), and :class:`EnvError`;
* :mod:`arlopti.tasks.env.tools`: a TRL environment's tools, their JSON schema and the parsing of
  the model's tool calls;
* :mod:`arlopti.tasks.env.loading`: ``task.env=path/to/file.py:Class`` / ``module:Class`` and the
  classes handed to ``arlopti.run(env=...)``;
* :mod:`arlopti.tasks.env.workers` (the trainer's side) and :mod:`arlopti.tasks.env.worker_host` (the
  processes): each episode's instance in a killable worker process of its own;
  :mod:`arlopti.tasks.env.calls`: one call of an instance, and the in-process runner for a class no
  worker can import by name.

The turn loop that runs them is :mod:`arlopti.rollout.turns`.
"""

from arlopti.tasks.env.base import RESERVED_METHODS, EnvError, TextEnv, ToolEnv, is_text_env

__all__ = ["EnvError", "RESERVED_METHODS", "TextEnv", "ToolEnv", "is_text_env"]
