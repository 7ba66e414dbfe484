"""Environments for the worker-process tests (arlopti.tasks.env.workers, arlopti.rollout.env_calls, turns).

They sit at the top level of an importable module, so a worker process imports them by name
(``helpers.worker_envs:<Class>``; pytest puts ``tests/`` on ``sys.path``). Each reads what it should do
from the row ``reset`` gets (the prompt record's meta), so one class serves several rounds of a test.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from arlopti.tasks.env import TextEnv


class Stateful(TextEnv):
    """Counts its steps; replies ``<count> <pid>``; ``close`` writes ``<pid> <count>`` to ``row["log"]``."""

    def reset(self, row):
        self.n, self.log = 0, row.get("log")
        return None

    def step(self, text):
        self.n += 1
        return f"{self.n} {os.getpid()}", False, None

    def close(self):
        if self.log:
            Path(self.log).write_text(f"{os.getpid()} {self.n}")


class Exiting(TextEnv):
    """Replies ``ok`` (reward 0.5), or, when the row says ``crash``, ends its process with ``os._exit(3)`` in
    ``step`` (``crash == "kill"``: SIGKILLs itself)."""

    def reset(self, row):
        self.crash = row.get("crash")
        return None

    def step(self, text):
        if self.crash == "kill":
            os.kill(os.getpid(), 9)
        if self.crash:
            os._exit(3)
        return "ok", False, 0.5


class Hanging(TextEnv):
    """``step`` marks its start in ``row["dir"]`` (``<pid>.started``), waits until ``row["n"]`` steps have
    started (at most 60 s), writes how many it saw (``<pid>.saw``), then hangs."""

    def reset(self, row):
        self.dir, self.n = Path(row["dir"]), int(row["n"])
        return None

    def step(self, text):
        (self.dir / f"{os.getpid()}.started").write_text(str(os.getpid()))
        seen, end = 0, time.monotonic() + 60
        while time.monotonic() < end:
            seen = len(list(self.dir.glob("*.started")))
            if seen >= self.n:
                break
            time.sleep(0.01)
        (self.dir / f"{os.getpid()}.saw").write_text(str(seen))
        time.sleep(3600)


class Drawing(TextEnv):
    """Draws from Python's ``random`` in ``__init__``, ``reset`` and ``step`` (what the seeding makes reproducible)."""

    def __init__(self):
        self.born = random.random()

    def reset(self, row):
        self.target = random.randint(1, 10 ** 6)
        return f"target {self.target} {self.born:.6f}"

    def step(self, text):
        r = random.random()
        return f"draw {r:.6f}", r < 0.2, r


#: What :class:`Shaped` steps return, by ``row["shape"]``.
SHAPES = {"pair": ("again", False), "pair_done": (None, True), "one": ("a",), "four": ("a", False, 1.0, 2),
          "number": (1, False), "text": "just text", "string_reward": ("a", False, "1")}


class Shaped(TextEnv):
    """``step`` returns ``SHAPES[row["shape"]]`` the first time, then ``SHAPES["pair_done"]``."""

    def reset(self, row):
        self.shape, self.n = row["shape"], 0
        return None

    def step(self, text):
        self.n += 1
        return SHAPES[self.shape] if self.n == 1 else SHAPES["pair_done"]


class Scored:
    """TRL's contract: one tool, and ``get_reward()`` returning ``float(row["reward"])`` (``nan``, ``inf``, ...)."""

    def reset(self, **row) -> str | None:
        self.reward = float(row["reward"])
        return None

    def get_reward(self) -> float:
        return self.reward

    def noop(self, x: int) -> int:
        """
        Return x.

        Args:
            x: Any number.
        """
        return x


class Payload:
    """An object whose unpickling would run ``touch <path>`` in whoever unpickles it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class Smuggling(TextEnv):
    """``step`` returns an object built to run a command where it is unpickled (``row["marker"]``: its file),
    and a numpy-like number (a :class:`numbers.Real` that is not a float) as the reward."""

    def reset(self, row):
        self.marker = row["marker"]
        return None

    def step(self, text):
        if text == "number":
            import fractions

            return "fine", False, fractions.Fraction(1, 4)
        return Payload(self.marker), False, None
