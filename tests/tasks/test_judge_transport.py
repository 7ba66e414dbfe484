"""The judge's HTTP client (arlopti/tasks/judge.py) against hostile stand-in servers on 127.0.0.1 (issue 52):
a redirect to another host, a server that trickles, a body of hundreds of megabytes, and malformed answers.
Each must end as a one-line :class:`JudgeError` naming the endpoint, soon, without reading the body whole; and
one bad answer fails only its own response.

The stand-in is a raw socket server (stdlib, one thread per connection) so that it can answer what no
``http.server`` would: a garbage status line, a dropped connection, a short body, a trickle. What it answers
is picked by a marker in the graded response (``[[drop]]``, ``[[trickle_body]]``, ...) or, for ``GET
/models``, by the base URL's first path segment. Nothing here touches the network beyond 127.0.0.1."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from arlopti.tasks.judge import DEFAULT_MAX_BODY_BYTES, JudgeError, make_judge

pytestmark = pytest.mark.timeout(60)  # a judge that hangs fails here instead of stalling the suite

TOKEN = "sk-secret-token-of-the-judge"
GIB = 2**30


def chat_answer(content) -> bytes:
    """vLLM's chat answer whose message content is ``content``."""
    return json.dumps({"object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}).encode()


def head(status: str = "200 OK", length: int | None = None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Connection: close\r\n"
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{size}{extra}\r\n".encode()


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: bytes


@dataclass
class RawServer:
    """A socket server on 127.0.0.1 that records each request and lets ``answer(request, sock)`` write raw bytes."""

    answer: object
    requests: list = field(default_factory=list)
    sent: list = field(default_factory=list)  # bytes each streaming answer managed to send
    threads: list = field(default_factory=list)

    def start(self) -> "RawServer":
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn):
        with conn:
            reader = conn.makefile("rb")
            line = reader.readline().decode()
            if not line:
                return
            method, path, _ = line.split(" ", 2)
            headers = {}
            while (h := reader.readline().decode().strip()):
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
            body = reader.read(int(headers.get("content-length", 0)))
            request = Request(method, path, headers, body)
            self.requests.append(request)
            try:
                self.answer(request, conn, self)
            except OSError:  # the client gave up: what a judge that stops reading does
                pass

    def url(self, prefix: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def close(self):
        self.sock.close()


def stream(conn, server: RawServer, total: int, prefix: bytes = b"", suffix: bytes = b""):
    """Send ``prefix``, ``total`` bytes of padding from a generator (no buffer of that size) and ``suffix``."""
    block, sent = b" " * 65536, 0
    try:
        conn.sendall(prefix)
        while sent < total:
            piece = block[:min(len(block), total - sent)]
            conn.sendall(piece)
            sent += len(piece)
        conn.sendall(suffix)
    finally:
        server.sent.append(sent)


def trickle(conn, data: bytes, every_s: float = 0.2, limit_s: float = 120):
    """One byte every ``every_s`` seconds (each shorter than the judge's timeout_s)."""
    stop = time.monotonic() + limit_s
    for i in range(len(data)):
        if time.monotonic() > stop:
            return
        conn.sendall(data[i:i + 1])
        time.sleep(every_s)


def hostile(request: Request, conn, server: RawServer):
    """The stand-in judge: a good ``Score: N`` for ``[[score:N]]``, and each hostile answer by its marker."""
    text = request.body.decode(errors="replace")
    if request.method == "GET":  # /<kind>/v1/models
        kind = request.path.split("/")[1]
        answer = {"list": b'[{"id": "m"}]', "nested": b"[" * 200_000 + b"]" * 200_000,
                  "dict": b'{"data": {"id": "m"}}', "ids": b'{"data": [{"id": 7}]}'}.get(kind)
        return conn.sendall(head(length=len(answer)) + answer)
    if m := re.search(r"\[\[redirect:(\d+):(\d+)\]\]", text):
        target = f"http://127.0.0.1:{m.group(2)}/v1/chat/completions"
        return conn.sendall(head(f"{m.group(1)} Moved", 0, f"Location: {target}\r\n"))
    if "[[trickle_body]]" in text:
        body = chat_answer("Score: 9")
        conn.sendall(head(length=len(body)))
        return trickle(conn, body)
    if "[[trickle_head]]" in text:
        return trickle(conn, head(length=2) + b"{}")
    if "[[huge_declared]]" in text:
        return stream(conn, server, 400 * 2**20, head(length=400 * 2**20))
    if "[[huge_stream]]" in text:
        return stream(conn, server, 400 * 2**20, head())
    if "[[huge_valid]]" in text:  # a valid answer whose score is preceded by 150 MB of padding
        prefix, suffix = chat_answer("@@").split(b"@@")
        size = 150 * 2**20
        return stream(conn, server, size, head(length=len(prefix) + size + len(b"Score: 9") + len(suffix)) + prefix,
                      b"Score: 9" + suffix)
    canned = {
        "[[garbage]]": b"GARBAGE LINE\r\n\r\n",
        "[[drop]]": b"",
        "[[short]]": head(length=100) + b'{"choices": [',
        "[[content7]]": head(length=len(chat_answer(7))) + chat_answer(7),
        "[[content_null]]": head(length=len(chat_answer(None))) + chat_answer(None),
        "[[nested]]": head(length=400_000) + b"[" * 200_000 + b"]" * 200_000,
        "[[a_list]]": head(length=2) + b"[]",
        "[[no_choices]]": head(length=15) + b'{"choices": []}',
        "[[bad_chunk]]": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "[[long_header]]": b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n",
        "[[not_utf8]]": head(length=4) + b"\xff\xfe\xfa\xfb",
        "[[http404_huge]]": head("404 Not Found", 50 * 2**20) + b"no such model " * 100,
    }
    for marker, raw in canned.items():
        if marker in text:
            return conn.sendall(raw)
    score = re.search(r"\[\[score:(\d+)\]\]", text)
    body = chat_answer(f"Fine.\nScore: {score.group(1) if score else 5}")
    conn.sendall(head(length=len(body)) + body)


@pytest.fixture()
def server():
    s = RawServer(hostile).start()
    yield s
    s.close()


@pytest.fixture()
def elsewhere():
    """Another host (another port): a redirect's target, which must receive nothing."""
    s = RawServer(lambda request, conn, _: conn.sendall(head(length=len(chat_answer("Score: 9")))
                                                         + chat_answer("Score: 9"))).start()
    yield s
    s.close()


def judge_error(judge, completion: str) -> str:
    """The one-line JudgeError that grading ``completion`` alone raises."""
    with pytest.raises(JudgeError) as err:
        judge(prompts=["Q?"], completions=[completion])
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ---- redirects and credentials -------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(server, elsewhere, monkeypatch, status):
    monkeypatch.setenv("JUDGE_KEY", TOKEN)
    judge = make_judge(server.url(), model="m", api_key_env="JUDGE_KEY", timeout_s=5)
    text = judge_error(judge, f"[[redirect:{status}:{elsewhere.port}]]")
    assert f"{server.url()}/chat/completions answered HTTP {status}" in text
    assert f"127.0.0.1:{elsewhere.port}" in text and "follows no redirect" in text
    assert server.requests[0].headers["authorization"] == f"Bearer {TOKEN}"  # the endpoint itself got the key
    time.sleep(0.2)  # a follow-up request, had there been one, has arrived by now
    assert elsewhere.requests == []  # nothing reached the other host: no answer, no key


# ---- one deadline for the whole request ----------------------------------------------------------------------

@pytest.mark.parametrize("marker", ["[[trickle_body]]", "[[trickle_head]]"])
def test_a_trickling_server_cannot_stall_the_request_past_timeout_s(server, marker):
    # each byte comes within the socket timeout (0.2 s < 1 s): only a deadline for the whole request ends it
    judge = make_judge(server.url(), model="m", timeout_s=1)
    text = judge_error(judge, marker)
    assert f"no complete answer from {server.url()}/chat/completions within timeout_s=1 s" in text


def test_the_deadline_is_per_request_so_a_slow_but_steady_server_gets_its_timeout_not_a_read_timeout(server):
    judge = make_judge(server.url(), model="m", timeout_s=30)
    assert judge(prompts=["Q?"], completions=["[[score:4]]"]) == [4.0]


# ---- a cap on the body -------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker", ["[[huge_declared]]", "[[huge_stream]]", "[[huge_valid]]"])
def test_a_huge_body_is_refused_after_reading_at_most_the_cap(server, marker):
    judge = make_judge(server.url(), model="m", timeout_s=30)
    text = judge_error(judge, marker)
    assert f"{server.url()}/chat/completions" in text
    assert f"more than max_body_bytes={DEFAULT_MAX_BODY_BYTES}" in text
    for thread in server.threads:  # the server stops once the judge hangs up
        thread.join(timeout=30)
    # what the server got out before the judge hung up: the cap plus the sockets' buffers, never the 150-400 MB
    assert server.sent and max(server.sent) < DEFAULT_MAX_BODY_BYTES + 64 * 2**20, server.sent


def test_the_cap_is_a_setting(server):
    judge = make_judge(server.url(), model="m", max_body_bytes=100)
    assert "more than max_body_bytes=100 bytes" in judge_error(judge, "[[score:3]]")
    assert make_judge(server.url(), model="m", max_body_bytes=10_000)(prompts=["Q?"], completions=["[[score:3]]"]) \
        == [3.0]
    with pytest.raises(ValueError, match="max_body_bytes=0"):
        make_judge(server.url(), max_body_bytes=0)


# ---- malformed answers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker,words", [
    ("[[garbage]]", "no valid HTTP answer (BadStatusLine"),
    ("[[drop]]", "no valid HTTP answer (RemoteDisconnected"),
    ("[[short]]", "short body: 13 of 100 bytes"),
    ("[[content7]]", "message.content is int"),
    ("[[content_null]]", "message.content is NoneType"),
    ("[[nested]]", "nested too deeply"),
    ("[[a_list]]", "no choices[0].message.content"),
    ("[[no_choices]]", "no choices[0].message.content"),
    ("[[bad_chunk]]", "no valid HTTP answer (IncompleteRead"),
    ("[[long_header]]", "LineTooLong"),
    ("[[not_utf8]]", "not JSON"),
    ("[[http404_huge]]", "answered HTTP 404"),
])
def test_a_malformed_answer_is_a_judge_error_naming_the_endpoint(server, marker, words):
    judge = make_judge(server.url(), model="m", timeout_s=10)
    text = judge_error(judge, marker)
    assert text.startswith(f"judge m at {server.url()}: {server.url()}/chat/completions") and words in text, text


@pytest.mark.parametrize("kind,words", [
    ("list", "answered a list, not the model list"),
    ("dict", "answered a dict, not the model list"),
    ("ids", "lists [7]"),
    ("nested", "nested too deeply"),
])
def test_a_malformed_model_list_is_a_judge_error_naming_the_endpoint(server, kind, words):
    judge = make_judge(server.url(f"/{kind}"), timeout_s=10)  # model=None: asks GET /models
    text = judge_error(judge, "[[score:5]]")
    assert f"{server.url(f'/{kind}')}/models" in text and words in text, text


# ---- one bad answer fails only its response --------------------------------------------------------------------

def test_one_bad_answer_fails_only_its_own_response(server, caplog):
    judge = make_judge(server.url(), model="m", timeout_s=10)
    with caplog.at_level(logging.WARNING, logger="arlopti.tasks.judge"):
        scores = judge(prompts=["Q?"] * 3, completions=["[[score:2]]", "[[content7]]", "[[score:8]]"])
    assert scores[0] == 2.0 and scores[2] == 8.0 and math.isnan(scores[1])  # NaN: a failure, never a number
    (record,) = [r for r in caplog.records if r.name == "arlopti.tasks.judge"]
    assert "1 of 3 responses got no score" in record.getMessage() and "message.content is int" in record.getMessage()
    assert judge.failures == 1
