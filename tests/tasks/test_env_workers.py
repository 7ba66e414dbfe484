"""The environment's worker processes (arlopti.tasks.env.workers, arlopti.tasks.env.worker_host): one process per
episode holding its instance, calls of different episodes at once, and a call that exits, is killed or hangs
taking down its own episode's process only."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from arlopti.rollout.env_calls import EnvCall
from arlopti.tasks.env.workers import EnvWorkerLoadError, EnvWorkers

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone_within(pids, seconds: float = 30.0) -> bool:
    """Whether every pid is gone within ``seconds`` (a bound on waiting, not a measurement)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.fixture
def workers():
    made = []

    def make(cls: str, text: bool = True) -> EnvWorkers:
        made.append(EnvWorkers(f"helpers.worker_envs:{cls}", cls, text))
        return made[-1]

    yield make
    for w in made:
        w.close()


def steps(key: int, row: dict, n: int) -> list[EnvCall]:
    return [EnvCall(key, "reset", (row,), 1, "reset")] + [EnvCall(key, "step", (f"t{k}",), 2 + k, "step")
                                                          for k in range(n)]


def test_each_episode_keeps_one_instance_in_a_process_of_its_own(workers, tmp_path):
    w = workers("Stateful")
    w.open([10, 11])
    logs = [tmp_path / "10.log", tmp_path / "11.log"]
    got = {(j, k): r for j, k, r in w.stream([steps(10, {"log": str(logs[0])}, 3),
                                              steps(11, {"log": str(logs[1])}, 2)], timeout_s=60)}
    assert all(r.ok for r in got.values()) and len(got) == 4 + 3
    replies = {j: [got[j, k].value[0] for k in range(1, 4 if j == 0 else 3)] for j in (0, 1)}
    pids = {j: {r.split()[1] for r in replies[j]} for j in (0, 1)}
    assert [r.split()[0] for r in replies[0]] == ["1", "2", "3"] and [r.split()[0] for r in replies[1]] == ["1", "2"]
    assert len(pids[0]) == len(pids[1]) == 1 and pids[0] != pids[1] and str(os.getpid()) not in pids[0] | pids[1]
    w.end([10, 11], timeout_s=30)  # close reaches the same instance, in the same process
    end = time.monotonic() + 30
    while time.monotonic() < end and not all(p.exists() and p.read_text() for p in logs):
        time.sleep(0.05)
    assert [p.read_text() for p in logs] == [f"{pids[0].pop()} 3", f"{pids[1].pop()} 2"]
    host = w._proc.pid
    assert gone_within(children_of(host))  # each episode's process exits after its close
    w.close()
    assert gone_within([host])


@pytest.mark.parametrize("crash, how", [("exit", "exited with code 3"),
                                        ("kill", "was killed by signal 9 (SIGKILL)")])
def test_an_episode_whose_process_ends_fails_with_one_line_naming_the_class_and_the_call(workers, crash, how):
    w = workers("Exiting")
    w.open([1, 2])
    jobs = [steps(1, {"crash": crash}, 3), steps(2, {}, 2)]
    got = {(j, k): r for j, k, r in w.stream(jobs, timeout_s=60)}
    r = got[0, 1]
    assert r.error == f"EnvWorkerDied: Exiting.step: the episode's environment process {how} during the call"
    assert r.gone and not r.timeout and "\n" not in r.error
    assert (0, 2) not in got and (0, 3) not in got  # its instance is gone: its later calls are not run
    assert [got[1, k].value for k in (1, 2)] == [("ok", False, 0.5)] * 2  # the other episode is untouched
    w.open([3])  # the host (and this process) go on
    (_, (_, _, again)) = list(w.stream([steps(3, {}, 1)], timeout_s=60))
    assert again.value == ("ok", False, 0.5) and w.stats["hosts"] == 1 and w.stats["died"] == 1


def test_a_call_past_its_timeout_is_killed_with_its_process(workers, tmp_path):
    w = workers("Hanging")
    w.open([1])
    got = list(w.stream([steps(1, {"dir": str(tmp_path), "n": 1}, 2)], timeout_s=2.0))
    assert [(k, r.timeout, r.gone) for _, k, r in got] == [(0, False, False), (1, True, True)]
    (pid,) = [int(p.stem) for p in tmp_path.glob("*.started")]
    assert gone_within([pid])  # SIGKILLed at the deadline, not abandoned
    assert w.stats["timeouts"] == 1


def test_a_host_that_dies_fails_the_calls_in_flight_and_another_starts(workers, tmp_path):
    w = workers("Hanging")
    w.open([1])
    host = w._proc.pid

    def kill_the_host_once_the_step_runs():
        end = time.monotonic() + 60
        while not list(tmp_path.glob("*.started")) and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(host, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_host_once_the_step_runs)
    killer.start()
    got = list(w.stream([steps(1, {"dir": str(tmp_path), "n": 1}, 1)], timeout_s=120))
    killer.join()
    r = got[-1][2]
    assert len(got) == 2 and got[0][2].ok and r.gone
    assert r.error == (f"EnvWorkerDied: Hanging.step: the environment's worker host (pid {host}) was killed by signal 9 "
                       "(SIGKILL) during the call")
    (episode,) = [int(p.stem) for p in tmp_path.glob("*.started")]
    assert gone_within([episode])  # an episode's process dies with its host
    w.open([2])
    assert w.stats["hosts"] == 2 and w._proc.pid != host


def test_a_class_the_host_cannot_import_is_a_load_error_naming_it():
    w = EnvWorkers("helpers.worker_envs:Nope", "Nope", True)
    with pytest.raises(EnvWorkerLoadError, match=r"helpers.worker_envs:Nope.*has no attribute 'Nope'"):
        w.open([1])


def test_a_value_built_to_run_code_where_it_is_read_is_refused_not_run(workers, tmp_path):
    """The trainer reads an episode's results as plain values only (arlopti.tasks.env.calls.plain_loads):
    an object whose unpickling runs a command is an error naming its type, and the command never runs,
    in the trainer or anywhere. Numbers of other types arrive as Python's own."""
    marker = tmp_path / "ran"
    w = workers("Smuggling")
    w.open([1])
    calls = [EnvCall(1, "reset", ({"marker": str(marker)},), 1, "reset"),
             EnvCall(1, "step", ("number",), 2, "step"), EnvCall(1, "step", ("object",), 3, "step")]
    got = [r for _, _, r in w.stream([calls], timeout_s=60)]
    assert got[1].value == ("fine", False, 0.25) and type(got[1].value[2]) is float
    assert got[2].error.startswith("TypeError: step returned a tuple, which cannot be sent back to the trainer")
    assert "posix.system is not a plain value" in got[2].error and "\n" not in got[2].error
    time.sleep(0.5)
    assert not marker.exists()
