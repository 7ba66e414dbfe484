"""The worker pool: hard kills at the deadline, replacement, crash retry, no leaked processes.

Most tests use ``preload_symbolic=False`` workers (no math-verify import, fast start) and the
``test.*`` worker hooks to force sleeps, C-level hangs and crashes. The 10,000-grading zombie
check with the real grader is in ``benchmarks/bench_grading.py``.
"""

import subprocess
import sys
import time

import pytest

from arlopti.tasks.math.pool import WorkerPool


def _alive(pids) -> list:
    """(pid, state) of the processes among ``pids`` that still exist, zombies included."""
    out = []
    for pid in set(pids):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.append((pid, state))
    return out


def _our_children(pids) -> list:
    try:
        import psutil
    except ImportError:
        return _alive(pids)  # our workers are never anyone else's children
    pids = set(pids)
    return [(c.pid, c.status()) for c in psutil.Process().children(recursive=True) if c.pid in pids]


@pytest.fixture()
def pool():
    p = WorkerPool(2, preload_symbolic=False)
    yield p
    p.close()
    assert _our_children(p.spawned_pids) == []


@pytest.mark.process


def test_results_and_order(pool):
    out = pool.run([("test.echo", (i,)) for i in range(20)], timeout_s=5)
    assert [o.status for o in out] == ["ok"] * 20
    assert [o.value for o in out] == list(range(20))


@pytest.mark.process


def test_timeout_kills_and_replaces(pool):
    pool.start()
    before = set(pool.pids)
    out = pool.run([("test.sleep", (30,)), ("test.echo", ("after",))], timeout_s=0.2)
    assert [o.status for o in out] == ["timeout", "ok"]
    assert pool.stats["killed_timeout"] == 1
    assert len(pool.pids) == 2 and set(pool.pids) != before
    # The killed worker is already reaped, not waiting for close().
    assert [p for p, _ in _our_children(pool.spawned_pids) if p not in pool.pids] == []


@pytest.mark.process


def test_c_level_hang_is_killed_within_the_bound(pool):
    pool.start()
    start = time.monotonic()
    out = pool.run([("test.bigint", (10**12,))], timeout_s=0.5)
    elapsed = time.monotonic() - start
    assert out[0].status == "timeout"
    assert elapsed < 0.5 + 1, elapsed  # the no-hang contract, not a speed check


@pytest.mark.process


def test_budget_bounds_the_whole_call(pool):
    pool.start()
    start = time.monotonic()
    out = pool.run([("test.sleep", (30,))] * 6, timeout_s=10, budget_s=0.5)
    elapsed = time.monotonic() - start
    assert [o.status for o in out] == ["timeout"] * 6
    assert elapsed < 0.5 + 1, elapsed


@pytest.mark.process


def test_crash_is_retried_once_then_reported(pool):
    out = pool.run([("test.exit", (3,)), ("test.echo", (1,))], timeout_s=5)
    assert out[0].status == "error" and "exit code 3" in out[0].error
    assert out[1].value == 1
    assert pool.stats["crashed"] == 2  # the first try and its retry


@pytest.mark.process


def test_worker_exception_is_an_error_not_a_crash(pool):
    out = pool.run([("symbolic_match", ("1", ("1",)))], timeout_s=5)  # not loaded in these workers
    assert (out[0].status, out[0].error) == ("error", "KeyError")
    assert pool.stats["crashed"] == 0


def test_unknown_function_and_closed_pool():
    p = WorkerPool(1, preload_symbolic=False)
    with pytest.raises(KeyError, match="unknown worker function"):
        p.run([("os.system", ("true",))], timeout_s=1)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.run([("test.echo", (1,))], timeout_s=1)


@pytest.mark.process


def test_retirement_after_max_tasks():
    p = WorkerPool(1, preload_symbolic=False, max_tasks_per_worker=3)
    try:
        out = p.run([("test.echo", (i,)) for i in range(7)], timeout_s=5)
        assert [o.value for o in out] == list(range(7))
        assert p.stats["retired"] == 2
    finally:
        p.close()
    assert _our_children(p.spawned_pids) == []


@pytest.mark.process
def test_workers_that_cannot_start_raise_a_clear_error():
    p = WorkerPool(1, memory_limit_mb=1)  # 1 MiB address space: the worker dies while importing
    try:
        with pytest.raises(RuntimeError, match="failed to start 3 times"):
            p.start()
    finally:
        p.close()
    assert _our_children(p.spawned_pids) == []


@pytest.mark.process


def test_many_timeouts_leave_no_zombies():
    p = WorkerPool(2, preload_symbolic=False)
    calls = [("test.sleep", (30,)) if i % 4 == 0 else ("test.echo", (i,)) for i in range(400)]
    try:
        out = p.run(calls, timeout_s=0.05)
        # At every point only the live workers exist: every killed one was reaped at once.
        assert sorted(p for p, _ in _our_children(p.spawned_pids)) == sorted(p.pids)
    finally:
        p.close()
    assert [o.status for o in out] == ["timeout" if i % 4 == 0 else "ok" for i in range(400)]
    assert p.stats["killed_timeout"] == 100
    assert _our_children(p.spawned_pids) == []
    assert _alive(p.spawned_pids) == []


@pytest.mark.process


def test_workers_die_with_their_parent():
    code = ("from arlopti.tasks.math.pool import WorkerPool\n"
            "p = WorkerPool(2, preload_symbolic=False); p.start()\n"
            "print(*p.pids, flush=True)\n"
            "p.run([('test.sleep', (60,))] * 2, timeout_s=120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.3)  # let both workers pick up their sleep
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(pids) == [], "orphaned grader workers outlived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
