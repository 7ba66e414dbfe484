"""Issue 52 row 4: no episode can wedge the environment's worker host. Every read from an episode has a deadline
and a bound: an episode that writes a partial message (a header then nothing, or a trickle) or promises an
oversized one is killed and fails alone, with one line; the other episodes of the batch, and later batches,
finish."""

from __future__ import annotations

import pytest

from arlopti.rollout.env_calls import EnvCall
from arlopti.tasks.env.workers import EnvWorkers

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]


@pytest.fixture
def wedging():
    made = []

    def make(**kwargs) -> EnvWorkers:
        made.append(EnvWorkers("helpers.env_edges:Wedging", "Wedging", True, **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()


def episode(key: int, wedge: str | None) -> list[EnvCall]:
    return [EnvCall(key, "reset", ({"wedge": wedge},), 1, "reset"), EnvCall(key, "step", ("t",), 2, "step")]


def run_batch(w: EnvWorkers, wedges: list[str | None], first_key: int, timeout_s: float = 60.0) -> dict:
    keys = list(range(first_key, first_key + len(wedges)))
    w.open(keys)
    got = {(j, k): r for j, k, r in w.stream([episode(key, x) for key, x in zip(keys, wedges)], timeout_s=timeout_s)}
    w.end(keys, timeout_s=5)
    return got


@pytest.mark.parametrize("wedge, why", [
    ("partial", "sent a partial message (its rest did not arrive within 1 s)"),
    ("trickle", "sent a partial message (its rest did not arrive within 1 s)"),
    ("oversized", "sent a message over the bound of 1048576 bytes"),
])
def test_a_broken_message_fails_its_own_episode_and_the_others_finish(wedging, wedge, why):
    w = wedging(read_deadline_s=1.0, max_message_bytes=2**20)
    got = run_batch(w, [wedge] + [None] * 8, first_key=0)
    bad = got[0, 1]
    assert bad.gone and not bad.timeout and "\n" not in bad.error, bad
    assert bad.error == f"EnvWorkerDied: Wedging.step: the episode's environment process {why}; it was killed"
    replies = [got[j, 1].value for j in range(1, 9)]
    assert all(r is not None and r[0].startswith("ok ") for r in replies), [got[j, 1] for j in range(1, 9)]
    again = run_batch(w, [None] * 4, first_key=100)  # the host serves later batches too
    assert all(again[j, 1].ok for j in range(4)) and w.stats["hosts"] == 1


def test_a_large_message_under_the_bound_arrives_whole(wedging):
    """The bound is on the message, not on one read: a 3 MB reply (more than a socket's buffer) arrives whole."""
    w = wedging(read_deadline_s=5.0, max_message_bytes=8 * 2**20)
    got = run_batch(w, ["big", None], first_key=0)
    assert got[0, 1].ok and len(got[0, 1].value[0]) == 3 * 2**20 and got[1, 1].ok, got
