"""Which worker processes a test leaves behind."""

from __future__ import annotations

import os


def our_children(pids) -> list:
    """Processes among ``pids`` that still exist (zombies included) as children of this process."""
    pids = set(pids)
    try:
        import psutil

        return [(c.pid, c.status()) for c in psutil.Process().children(recursive=True) if c.pid in pids]
    except ImportError:
        out = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    state, ppid = fh.read().rsplit(")", 1)[1].split()[:2]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(ppid) == os.getpid():
                out.append((pid, state))
        return out
