"""Environments that break the contract at its edges (issue 52): bad ``done`` / reward values, and episodes
that write a broken message on their own socket to the worker host.

They sit at the top level of an importable module, so a worker process imports them by name
(``helpers.env_edges:<Class>``). Each reads what to do from the row ``reset`` gets (the prompt's meta).
"""

from __future__ import annotations

import os
import struct
import time

from arlopti.tasks.env import TextEnv

#: What :class:`StepReturns`' first ``step`` returns, by the row's ``case``.
STEP_RETURNS = {
    "done_no": ("a", "no", 0.0),  # a non-empty string is truthy: it used to end every episode silently
    "done_two": ("a", 2, 0.0),
    "done_half": ("a", 0.5, None),
    "done_none": ("a", None, None),
    "reward_huge": ("a", True, 10**400),  # float() of it overflows
    "reward_nan": ("a", True, float("nan")),
    "reward_inf": ("a", True, float("-inf")),
    "reward_str": ("a", True, "1.0"),
    "ints": ("a", 1, 2),  # done 1 and an int reward are fine
    "zero": ("a", 0, None),  # done 0: the episode goes on
}

#: What :class:`RewardReturns.get_reward` returns, by the row's ``case``.
REWARDS = {"huge": 10**400, "str": "0.5", "none": None, "int": 3}


class StepReturns(TextEnv):
    """``step`` returns ``STEP_RETURNS[row["case"]]`` the first time, then ends the episode."""

    def reset(self, row):
        self.case, self.n = row["case"], 0
        return None

    def step(self, text):
        self.n += 1
        return STEP_RETURNS[self.case] if self.n == 1 else (None, True, None)


class RewardReturns:
    """TRL's contract: one tool, and ``get_reward()`` returning ``REWARDS[row["case"]]``."""

    def reset(self, **row) -> str | None:
        self.case = row["case"]
        return None

    def get_reward(self):
        return REWARDS[self.case]

    def noop(self, x: int) -> int:
        """
        Return x.

        Args:
            x: Any integer.
        """
        return x


def _own_socket() -> int:
    """The episode process's socket to its host: the only socket it holds (every other descriptor is closed)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                return int(name)
        except OSError:
            continue
    raise RuntimeError("no socket")


class Wedging(TextEnv):
    """``step`` replies ``ok <pid>``, or, by the row's ``wedge``, writes on its socket to the host:

    * ``partial``: a header promising 1 MB, then nothing (and hangs);
    * ``trickle``: a header promising 1,000 bytes, then one byte every 0.2 s;
    * ``oversized``: a header promising 2 GB - 1, then hangs;
    * ``big``: a well-formed 3 MB reply (more than a socket's buffer)."""

    def reset(self, row):
        self.wedge = row.get("wedge")
        return None

    def step(self, text):
        if not self.wedge:
            return f"ok {os.getpid()}", False, 0.0
        if self.wedge == "big":
            return "x" * (3 * 2**20), False, 0.0
        fd = _own_socket()
        size = {"partial": 2**20, "trickle": 1000, "oversized": 2**31 - 1}[self.wedge]
        os.write(fd, struct.pack("!i", size))  # multiprocessing.connection's header: the length, big-endian
        for _ in range(3000):
            if self.wedge == "trickle":
                os.write(fd, b"x")
            time.sleep(0.2)
        return "never", False, 0.0
