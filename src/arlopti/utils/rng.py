"""Capture and restore the process's random-number generators (for exact resume).

The state is a dict of plain Python values and uint8 tensors (so that a checkpoint holding it
still loads with ``torch.load(weights_only=True)``): Python's ``random``, NumPy's legacy global
generator, torch's CPU generator and, when CUDA is initialised, every CUDA device's generator.
The training loop itself draws no global random numbers (rollout seeds are derived from
``rollout.seed``, the rollout step and the rank; the data order from ``data.seed`` and the
epoch), so these states matter only for user code that does.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng_state() -> dict:
    """The current state of every global generator of this process."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Set the generators from :func:`capture_rng_state`'s output (missing entries are left alone)."""
    if "python" in state:
        random.setstate(_as_python_state(state["python"]))
    if "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8).cpu() for s in cuda])


def _as_python_state(s):
    # random.setstate needs tuples; a checkpoint round trip can turn the inner tuple into a list
    version, internal, gauss = s
    return version, tuple(internal), gauss


def gather_rng_states(world_size: int) -> list[dict]:
    """Every rank's :func:`capture_rng_state`, in rank order (collective when ``world_size > 1``)."""
    if world_size == 1:
        return [capture_rng_state()]
    import torch.distributed as dist

    states: list = [None] * world_size
    dist.all_gather_object(states, capture_rng_state())
    return states
