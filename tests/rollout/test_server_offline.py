"""The parts of rollout.placement=server that need no vLLM: the worker's command line, the served name
that carries the base identity, the weight-update layout, the split of a step between workers, and
what a fault does to a worker the trainer did not start or one out of restarts."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch

from arlopti.config import RolloutConfig, ServerConfig
from arlopti.rollout.gloo_transfer import GlooUpdateInfo, layout
from arlopti.rollout.serve import server_env, vllm_server_argv
from arlopti.rollout.server_client import RolloutWorker, WorkerError, served_model_name
from arlopti.rollout.server_rollouts import Batch, ServerRollouts, _split


def test_the_worker_runs_vllms_server_with_the_rl_routes_and_the_gloo_transfer():
    argv = vllm_server_argv("/m", "arlopti-0123456789abcdef", "float32", 4352, RolloutConfig(seed=7),
                            host="0.0.0.0", port=8100)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(argv)
    for flag in ("--served-model-name arlopti-0123456789abcdef", "--weight-transfer-config "
                 '{"backend": "arlopti_gloo"}', "--worker-extension-cls arlopti.rollout.gloo_transfer.GlooWorkerExtension",
                 "--logprobs-mode processed_logprobs", "--enable-scale-out", "--seed 7", "--load-format dummy",
                 "--port 8100", "--host 0.0.0.0", "--enforce-eager"):
        assert flag in text, flag
    env = server_env({"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert served_model_name({"fingerprint": "f" * 64}) == "arlopti-" + "f" * 16


def test_the_update_layout_names_every_tensor_and_its_bucket():
    items = [("a", torch.zeros(2, 3)), ("b", torch.zeros(4, dtype=torch.bfloat16)), ("c", torch.zeros(1))]
    info = GlooUpdateInfo(**layout(items, [2, 1]))
    assert info.names == ["a", "b", "c"] and info.dtype_names == ["float32", "bfloat16", "float32"]
    assert info.shapes == [[2, 3], [4], [1]] and info.bucket_sizes == [2, 1]
    with pytest.raises(ValueError, match="buckets summing to 2"):
        GlooUpdateInfo(**layout(items, [1, 1]))


@pytest.mark.parametrize("n,parts", [(8, 1), (8, 3), (2, 4), (7, 2)])
def test_a_step_is_split_between_workers_in_contiguous_whole_groups(n, parts):
    chunks = _split(n, parts)
    assert chunks[0][0] == 0 and chunks[-1][1] == n and len(chunks) == parts
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    sizes = [hi - lo for lo, hi in chunks]
    assert max(sizes) - min(sizes) <= 1


def _pool(worker: RolloutWorker, max_restarts: int = 2) -> ServerRollouts:
    cfg = RolloutConfig(placement="server", server=ServerConfig(max_restarts=max_restarts))
    pool = ServerRollouts([worker], cfg, "arlopti-x", tokenizer=None, group_size=2)
    done = Future()
    done.set_result([])
    pool.queue[3] = Batch(3, None, 1, done)
    return pool


def test_a_failed_worker_started_elsewhere_stops_the_run_naming_it():
    worker = RolloutWorker.remote("gpu7:8100", ServerConfig(transfer_host="trainer"))
    pool = _pool(worker)
    with pytest.raises(RuntimeError, match=r"(?s)rollout worker http://gpu7:8100: .*dead.*started separately"):
        pool._recover(WorkerError(worker.name, "inference/v1/generate failed (dead?)"), 0)
    assert not pool.queue and pool.version is None  # nothing queued survives a fault


def test_a_spawned_worker_out_of_restarts_stops_the_run_naming_it_and_its_log(tmp_path):
    worker = RolloutWorker("127.0.0.1:1", timeout_s=1, transfer_host="127.0.0.1", name="worker0",
                           spawn_args={"cfg_file": "", "log": str(tmp_path / "worker0.log"), "startup_timeout_s": 1})
    worker.restarts = 1
    with pytest.raises(RuntimeError, match=r"(?s)worker0: .*hung.*restarted 1 time\(s\) already "
                                           r"\(rollout.server.max_restarts=1\); its log: .*worker0.log"):
        _pool(worker, max_restarts=1)._recover(WorkerError("worker0", "x unanswered: hung"), 0)


def test_a_worker_of_another_base_is_refused_by_name(monkeypatch):
    worker = RolloutWorker.remote("h:1", ServerConfig())
    monkeypatch.setattr(RolloutWorker, "get", lambda self, path: {"data": [{"id": "arlopti-aaaa"}]})
    with pytest.raises(WorkerError, match="was built from another base model"):
        worker.check_base("arlopti-bbbb")
    monkeypatch.setattr(RolloutWorker, "get", lambda self, path: {"data": [{"id": "Qwen/Qwen2.5-7B"}]})
    with pytest.raises(WorkerError, match="was not started by arlopti.rollout.serve"):
        worker.check_base("arlopti-bbbb")
    monkeypatch.setattr(RolloutWorker, "get", lambda self, path: {"data": [{"id": "arlopti-bbbb"}]})
    worker.check_base("arlopti-bbbb")
    # the trainer's LoRA adapts the tied embedding (its head untied), the worker was started without model.lora
    with pytest.raises(WorkerError, match=r"serves the trainer's base with the LM head tied to the embedding, but "
                                          r"this run needs its own copy of the LM head \(model.lora adapts the "
                                          r"embedding.*model.lora.\* overrides"):
        worker.check_base("arlopti-bbbb-untied-head")
    monkeypatch.setattr(RolloutWorker, "get", lambda self, path: {"data": [{"id": "arlopti-bbbb-untied-head"}]})
    with pytest.raises(WorkerError, match=r"serves the trainer's base with its own copy of the LM head, but this "
                                          r"run needs the LM head tied"):
        worker.check_base("arlopti-bbbb")
    worker.check_base("arlopti-bbbb-untied-head")


def test_a_response_from_another_weight_version_is_an_error():
    worker = RolloutWorker.remote("h:1", ServerConfig())
    worker.version = 4
    response = {"choices": [{"token_ids": [5, 6], "finish_reason": "length",
                             "weight_versions": [{"version": "4", "start": 0, "end": 1},
                                                 {"version": "5", "start": 1, "end": 2}],
                             "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]}}]}

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    with pytest.raises(WorkerError, match=r"weight version\(s\) \['4', '5'\]"):
        worker._completion(response, True, Tok())
    response["choices"][0]["weight_versions"] = [{"version": "4", "start": 0, "end": 2}]
    c = worker._completion(response, True, Tok())
    assert c.token_ids == [5, 6] and c.logprobs == [-1.0, -2.0] and c.truncated


def test_two_workers_share_a_step_in_prompt_order_with_their_seeds(monkeypatch):
    """The batch's prompts go to the workers in contiguous whole groups; the completions come back in
    the step's prompt order, and each worker seeds prompt i of its share as prompt first + i of the step."""
    from types import SimpleNamespace

    from arlopti.rollout.engine import Completion, SamplingConfig

    calls = []

    def fake_generate(self, prompts, first, n, sampling, tokenizer, pool):
        calls.append((self.name, first, len(prompts)))
        return [[Completion([first + i, j], "", "stop") for j in range(n)] for i in range(len(prompts))]

    monkeypatch.setattr(RolloutWorker, "generate", fake_generate)
    workers = [RolloutWorker.remote(f"h{i}:1", ServerConfig()) for i in range(2)]
    pool = ServerRollouts(workers, RolloutConfig(placement="server"), "arlopti-x", tokenizer=None, group_size=3)
    batch = Batch(0, SimpleNamespace(prompt_ids=[[9]] * 5), 0, Future())
    out = pool._generate(batch, SamplingConfig(seed=1))
    assert [[c.token_ids for c in g] for g in out] == [[[i, j] for j in range(3)] for i in range(5)]
    assert sorted(calls) == [("http://h0:1", 0, 3), ("http://h1:1", 3, 2)]
    assert {"worker0/tokens_per_s", "worker1/tokens_per_s", "generate_s"} <= set(batch.stats)
    pool.close()


def test_each_spawned_worker_gets_its_own_gpu_when_devices_are_given(tmp_path):
    from arlopti.config import ConfigError, ModelConfig, RunConfig, validate_run
    from arlopti.rollout.server_client import worker_env

    assert worker_env([], 0) == {} and worker_env(["4", "5"], 1) == {"CUDA_VISIBLE_DEVICES": "5"}
    cfg = RolloutConfig(placement="server", server=ServerConfig(num_workers=2, devices=["4", "5"]))
    worker = RolloutWorker.spawn(1, ModelConfig(), cfg, tmp_path)
    assert worker.spawn_args["env"] == {"CUDA_VISIBLE_DEVICES": "5"}
    validate_run(RunConfig(rollout=cfg))
    with pytest.raises(ConfigError, match=r"rollout.server.devices=\['4'\] names the GPU of each spawned worker"):
        validate_run(RunConfig(rollout=RolloutConfig(placement="server", server=ServerConfig(num_workers=2,
                                                                                             devices=["4"]))))


def _spawned(tmp_path, name: str = "worker0") -> RolloutWorker:
    """A worker the trainer spawned (it has spawn_args), at an address where nothing runs."""
    return RolloutWorker("127.0.0.1:1", timeout_s=1, transfer_host="127.0.0.1", name=name,
                         spawn_args={"cfg_file": "", "log": str(tmp_path / f"{name}.log"), "startup_timeout_s": 1})


def test_a_worker_that_dies_during_the_weight_broadcast_is_a_worker_fault():
    """gloo reports a dead peer as a RuntimeError: as a WorkerError the pool restarts the worker or saves
    the run's steps and stops, instead of the run dying without a checkpoint."""
    class DeadPeer:
        def send(self, *args):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:1234")

    worker = RolloutWorker.remote("h:1", ServerConfig())
    worker.sender = DeadPeer()
    with pytest.raises(WorkerError, match=r"rollout worker http://h:1: the weight sync to version 3 failed: "
                                          r"RuntimeError: .*Connection closed by peer.*\(dead\?\)"):
        worker.sync([], 1, torch.float32, 3)
    assert worker.version is None  # not marked as synced


def test_a_restart_that_fails_stops_the_run_as_lost_workers(tmp_path, monkeypatch):
    """A spawned worker that does not come back is RolloutWorkersLost (the callback saves the steps
    first), naming the first fault and the failed restart."""
    from arlopti.rollout.server_rollouts import RolloutWorkersLost

    def never_ready(self, *args, **kwargs):
        raise WorkerError(self.name, "did not answer within 1 s (rollout.server.startup_timeout_s)")

    monkeypatch.setattr(RolloutWorker, "launch", lambda self: None)
    monkeypatch.setattr(RolloutWorker, "wait_ready", never_ready)
    pool = _pool(_spawned(tmp_path), max_restarts=1)
    try:
        with pytest.raises(RolloutWorkersLost, match=r"(?s)worker0: inference/v1/generate failed.*"
                                                     r"Restarting it failed: .*worker0: did not answer within 1 s"):
            pool._recover(WorkerError("worker0", "inference/v1/generate failed (dead?)"), 0)
        assert pool.restarts == 1
    finally:
        pool.close()


@pytest.mark.process


def test_a_killed_supervisor_is_warned_about_and_its_group_stopped(tmp_path, caplog):
    """kill -9 of a spawned worker's supervisor alone: the trainer says so within seconds, naming the
    worker and the pid, and kills what is left of its process group (here a child of the supervisor)."""
    import logging
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    supervisor = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                                   "subprocess.Popen(['sleep', '60'])\ntime.sleep(60)"], start_new_session=True)
    worker = _spawned(tmp_path)
    worker.process = supervisor
    pool = _pool(worker)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(supervisor.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = psutil.Process(supervisor.pid).children()
        with caplog.at_level(logging.WARNING, logger="arlopti.rollout.server_rollouts"):
            os.kill(supervisor.pid, signal.SIGKILL)
            while "its supervisor" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
        assert f"rollout worker0: its supervisor (pid {supervisor.pid}, python -m arlopti.rollout.serve) exited " \
               "with status -9 while the run goes on" in caplog.text
        deadline = time.monotonic() + 5
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(child), "the supervisor's child outlived it"
    finally:
        worker.process = None
        pool.close()
        RolloutWorker.kill_group(supervisor.pid)


@pytest.mark.process


def test_a_fault_seen_before_the_watcher_looks_still_names_the_killed_supervisor(tmp_path, caplog, monkeypatch):
    """The request that fails can come back before the once-a-second watcher looks (CI saw it under load):
    the fault path looks itself, so the warning naming the supervisor comes before the run stops."""
    import logging
    import subprocess
    import sys

    from arlopti.rollout.server_rollouts import RolloutWorkersLost

    monkeypatch.setattr(ServerRollouts, "_watch_supervisors", lambda self, every_s=1.0: None)  # never looks
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    worker = _spawned(tmp_path)
    worker.process = supervisor
    pool = _pool(worker, max_restarts=0)
    try:
        supervisor.kill()
        supervisor.wait(timeout=10)
        with caplog.at_level(logging.WARNING, logger="arlopti.rollout.server_rollouts"):
            with pytest.raises(RolloutWorkersLost, match=r"max_restarts=0"):
                pool._recover(WorkerError("worker0", "inference/v1/generate failed (dead?)"), 0)
        assert caplog.text.count(f"rollout worker0: its supervisor (pid {supervisor.pid}, python -m "
                                 "arlopti.rollout.serve) exited with status -9") == 1
        pool._stop_orphaned_groups()  # said once, not at every look
        assert caplog.text.count("its supervisor") == 1
    finally:
        worker.process = None
        pool.close()


def _running(proc) -> bool:
    """Whether ``proc`` (a psutil.Process) runs: neither gone nor a zombie."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_resumed_asynchronous_server_run_is_told_why_it_is_not_bit_identical():
    """The note of a resume (callbacks.rollout.resume_note): placement=server with max_staleness >= 1
    only, and only when resumed (step > 0)."""
    from arlopti.callbacks.rollout import resume_note
    from arlopti.config import AsyncConfig

    server = RolloutConfig(placement="server", async_=AsyncConfig(max_staleness=2))
    note = resume_note(server, 3)
    assert note.startswith("resumed at rollout step 3 with rollout.async.max_staleness=2: the batches that were "
                           "in flight are not in the checkpoint") and "not bit-identical" in note
    assert "docs/scaling.md" in note
    assert resume_note(server, 0) is None  # a fresh run
    assert resume_note(RolloutConfig(placement="server", async_=AsyncConfig(max_staleness=0)), 3) is None
    assert resume_note(RolloutConfig(placement="colocated"), 3) is None


@pytest.mark.parametrize("override,line", [
    ("rollout.dtype=fp8", "ConfigError: rollout.dtype='fp8': use 'float32', 'bfloat16' or 'float16', or null"),
    ("rollout.server.port=abc", "ConfigError: rollout.server.port=abc: expected an int"),
    ("rollout.bogus=1", "ConfigError: rollout.bogus=1: no such key; `rollout` has: async, backend,"),  # issue 54
])
def test_the_worker_command_reports_a_bad_setting_in_one_line_with_status_1(override, line, capsys, monkeypatch):
    """``python -m arlopti.rollout.serve`` with a bad setting: the trainer's one-line report, before any
    model loads (loading would raise here)."""
    import runpy
    import sys
    import warnings

    import arlopti.models.loading

    def loaded(*a, **k):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(arlopti.models.loading, "load_tokenizer", loaded)
    monkeypatch.setattr(sys, "argv", ["serve", "model=tiny_vllm", override])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
        runpy.run_module("arlopti.rollout.serve", run_name="__main__")
    assert exit_.value.code == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith(line), err
