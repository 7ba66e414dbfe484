"""What the trainer's side of a rollout worker says about addresses that are not rollout workers, without vLLM:
a refused connection is reported at once and then every few seconds (not only after the whole timeout,
and naming the timeout that ran), a server answering 404 or non-JSON is refused at once, a server that
never joins the weight-transfer group is named; a worker serves one run at a time; nothing is generated
past the run's last step."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from arlopti.config import AsyncConfig, RolloutConfig, ServerConfig
from arlopti.rollout.gloo_transfer import GlooWorkerExtension, store_answers
from arlopti.rollout.server_client import RolloutWorker, WorkerError, free_port
from arlopti.rollout.server_rollouts import Batch, ServerRollouts


def _serve(handler_body: tuple[int, str, str]) -> tuple[http.server.HTTPServer, str]:
    """A local HTTP server answering every GET and POST with ``(status, content type, body)``."""
    status, ctype, body = handler_body

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer

        def log_message(self, *args):  # quiet
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def test_a_refused_connection_is_reported_at_once_and_names_the_timeout_that_ran(caplog):
    worker = RolloutWorker.remote(f"127.0.0.1:{free_port()}", ServerConfig(timeout_s=1.5))
    with caplog.at_level(logging.INFO, logger="arlopti.rollout.server_client"):
        with pytest.raises(WorkerError, match=r"did not answer at .* within 2 s \(rollout.server.timeout_s\)"):
            worker.wait_ready(1.5, "rollout.server.timeout_s", report_every_s=0.5)
    waits = [r.message for r in caplog.records if "waiting for rollout" in r.message]
    assert waits and "connection refused" in waits[0] and "rollout.server.timeout_s=2" in waits[0]
    assert len(waits) >= 2  # and again while it waits


@pytest.mark.parametrize("answer, match", [
    ((404, "text/plain", "Not Found"), r"/v1/models answered 404 .*not a vLLM server"),
    ((200, "text/html", "<html>hello</html>"), r"/v1/models answered '<html>hello</html>', not vLLM's model list"),
])
def test_a_server_that_is_not_vllm_is_refused_at_once(answer, match):
    server, url = _serve(answer)
    try:
        worker = RolloutWorker.remote(url, ServerConfig())
        with pytest.raises(WorkerError, match=match):
            worker.wait_ready(60, "rollout.server.timeout_s")  # no waiting out the minute
        with pytest.raises(WorkerError, match=r"not (JSON|a vLLM)|answered 404"):
            worker.get("v1/models")
    finally:
        server.shutdown()


def test_a_fake_with_the_right_name_that_never_joins_the_weight_group_is_named():
    body = '{"data": [{"id": "arlopti-x"}], "results": [{"ok": true}]}'
    server, url = _serve((200, "application/json", body))
    try:
        worker = RolloutWorker.remote(url, ServerConfig(timeout_s=2, transfer_host="127.0.0.1"))
        worker.wait_ready(5, "rollout.server.timeout_s")
        worker.check_base("arlopti-x")
        with pytest.raises(WorkerError, match=rf"rollout worker http://{url}: did not join the weight-transfer group "
                                              r"on 127.0.0.1 within 2 s \(rollout.server.timeout_s\)"):
            worker.start_transfer("run A")
    finally:
        server.shutdown()


def test_a_worker_serves_one_live_run_and_is_taken_over_once_that_run_is_gone():
    ext = GlooWorkerExtension()
    alive = socket.socket()
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    port = alive.getsockname()[1]
    assert store_answers("127.0.0.1", port)
    assert ext.arlopti_claim("run A", "127.0.0.1", str(port)) == {"ok": True, "holder": "run A"}
    assert ext.arlopti_claim("run B", "127.0.0.1", "1") == {"ok": False, "holder": "run A"}  # A's store answers
    assert ext.arlopti_claim("run A", "127.0.0.1", str(port))["ok"]  # A reconnecting (a restart) is fine
    alive.close()  # run A's trainer is gone
    assert not store_answers("127.0.0.1", port)
    assert ext.arlopti_claim("run B", "127.0.0.1", "1") == {"ok": True, "holder": "run B"}


def test_a_busy_worker_refuses_the_second_run_by_name(monkeypatch):
    worker = RolloutWorker.remote("h:1", ServerConfig(timeout_s=5, transfer_host="127.0.0.1"))
    monkeypatch.setattr(RolloutWorker, "post",
                        lambda self, path, json=None: {"results": [{"ok": False, "holder": "logs/kk/a (rank 0)"}]})
    with pytest.raises(WorkerError, match=r"rollout worker http://h:1: it serves another run, logs/kk/a \(rank 0\), "
                                          r"whose trainer is alive"):
        worker.start_transfer("logs/kk/b (rank 0)")


def test_nothing_is_generated_past_the_runs_last_step(monkeypatch):
    """max_staleness=5 on a 3-step run: the queue never holds a step >= 3 (the callback's ``ahead`` says None)."""
    cfg = RolloutConfig(placement="server", async_=AsyncConfig(max_staleness=5))
    pool = ServerRollouts([], cfg, "arlopti-x", tokenizer=None, group_size=2)
    queued = []
    monkeypatch.setattr(pool, "_sync", lambda policy, version, prompt: setattr(pool, "version", version))

    def queue(step, prompts, sampling):
        done = Future()
        done.set_result([])
        queued.append(step)
        pool.queue[step] = Batch(step, prompts, pool.version, done)
        pool.last_scheduled = step

    monkeypatch.setattr(pool, "_queue", queue)
    batch = SimpleNamespace(prompt_ids=[[1]])
    for step in range(3):
        pool.collect(None, step, step, batch, ahead=lambda j, s=step: batch if s + j <= 2 else None)
    assert queued == [0, 1, 2]
    pool.close()
