"""A generative judge: a reward function that asks an OpenAI-compatible chat endpoint to grade each response.

The endpoint is any server of the OpenAI chat API: ``vllm serve <model>`` (``http://127.0.0.1:8000/v1``), or
this project's rollout worker (``python -m arlopti.rollout.serve``, which runs vLLM's OpenAI server: its
``/v1/chat/completions`` answers with the policy being trained). Only the standard library talks to it
(``http.client``, hardened: "Trust" below), one request per response, ``concurrency`` at a time.

A judge follows TRL's reward-function convention, ``judge(prompts, completions, **columns) -> list[float]``
(TRL's ``reward_funcs`` entries; :func:`arlopti.tasks.user_code.trl_convention`), so the same object works in
TRL and here. Build one with :func:`make_judge` at the top of a file of yours and point ``task.reward_fn``
(or an entry of ``task.reward_fns``) at it::

    # my_task/judge.py
    from arlopti.tasks.judge import make_judge

    judge = make_judge("http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct")

    python train.py task=custom task.reward_fn=my_task/judge.py:judge task.timeout_s=60 ...

For response ``i`` the judge sends ``template.format(prompt=..., completion=..., min_score=..., max_score=...,
<column>=...)`` as the user message (after ``system_prompt``, if any), at ``temperature`` (default 0) with
``max_tokens``, and reads the score as the *last* match of ``pattern`` (default ``Score: <number>``) in the
answer's text::

    r_i = float(last match of pattern in answer_i),  required min_score <= r_i <= max_score

``prompt`` is the record's prompt: chat messages are shown as ``role: content`` lines, raw text as it is;
``completion`` is the response (a TRL chat completion, a list of messages, as its contents). Every other
``{name}`` of the template must be a column of the data (``ground_truth``, or a meta key).

Nothing becomes a silent 0: a request past ``timeout_s``, a refused connection, an HTTP error, an answer that
is not the chat API's JSON, an answer without a score or with a score outside the range each give
:class:`JudgeError`, one line naming the endpoint, the model and what came back; ``retries`` (default 0) asks
again first. One bad answer fails only its own response: the call returns NaN there (the custom task's mark of
a failed response: ``reward/error`` for that response alone, counted, and past ``task.max_error_frac`` the run
stops) and logs one warning per call naming how many failed and the first reason. When every response of the
call fails, the call raises that :class:`JudgeError` instead (under ``task=custom``, the stop rule then names
it). In TRL, where NaN reads as "does not apply", the warning is the record. Keep ``timeout_s`` within
``task.timeout_s`` (the task kills a call of ``k`` responses after ``k * task.timeout_s`` seconds, which counts
as a timeout).

Trust (the client, :func:`_exchange`; plain ``http.client``, no proxy variables): a redirect is never followed
(a 3xx is a :class:`JudgeError` naming where it pointed), so the bearer token of ``api_key_env`` goes to
``base_url``'s host and nowhere else; ``timeout_s`` is one deadline for the whole request (connect, send,
status line, headers, body: a watchdog shuts the socket when it passes, so a server trickling a byte a second
cannot stall it); the body is read in chunks, at most ``max_body_bytes + 1`` bytes (default
:data:`DEFAULT_MAX_BODY_BYTES`, 4 MiB: a chat answer is kilobytes), and refused beyond; a malformed answer (a
garbage status line, a dropped connection, a short body, JSON nested too deeply, a ``content`` that is not a
string, ``/models`` answering another shape) is a :class:`JudgeError` like any other. Name resolution
(``getaddrinfo``) is the system's and not under the deadline: give an IP address or a host the resolver
answers quickly.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import socket
import string
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You grade an assistant's answer to a request.\n\n"
    "[Request]\n{prompt}\n\n"
    "[Answer]\n{completion}\n\n"
    "Judge how correct, helpful and clear the answer is. Explain briefly, then end with a line "
    "'Score: N', N an integer from {min_score} to {max_score} ({max_score} is best)."
)
DEFAULT_PATTERN = r"Score:\s*\**\s*(-?\d+(?:\.\d+)?)"
_BUILT_IN_FIELDS = ("prompt", "completion", "min_score", "max_score")
#: The default cap on an answer's body (``make_judge(max_body_bytes=...)``): a chat answer is kilobytes.
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
_CHUNK_BYTES = 64 * 1024  # one read of the body: the cap is checked between reads
_ERROR_BODY_BYTES = 2000  # what an HTTP error's body shows, at most


class JudgeError(RuntimeError):
    """The judge could not give a score (the message, one line, says why); never turned into a number."""


def _excerpt(text: Any, n: int = 200) -> str:
    """A one-line excerpt of ``text`` (its repr, cut to ``n`` characters)."""
    try:
        shown = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    except RecursionError:  # an answer nested deeper than str() goes
        return "<nested too deeply to show>"
    return repr(shown[:n]) + ("..." if len(shown) > n else "")


def show_prompt(prompt: Any) -> str:
    """The prompt as the judge reads it: chat messages as ``role: content`` lines, text as it is."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)
    raise JudgeError(f"judge: a prompt must be a string or chat messages, got {type(prompt).__name__} "
                     f"{_excerpt(prompt, 60)} (under task=custom the rollout passes the record's prompt)")


def show_completion(completion: Any) -> str:
    """The response's text (a TRL chat completion, a list of messages, as its contents joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and all(isinstance(m, dict) for m in completion):
        return "\n".join(str(m.get("content", "")) for m in completion)
    raise JudgeError(f"judge: a completion must be a string or chat messages, got {type(completion).__name__}")


def parse_score(text: str, pattern: re.Pattern, low: float, high: float) -> float:
    """The last match of ``pattern`` (its first group) in ``text`` as a number in ``[low, high]``;
    a :class:`JudgeError` naming what the answer said otherwise."""
    found = pattern.findall(text or "")
    if not found:
        raise JudgeError(f"no score in the answer (pattern {pattern.pattern!r}): {_excerpt(text)}")
    raw = found[-1] if isinstance(found[-1], str) else found[-1][0]
    try:
        score = float(raw)
    except ValueError:
        raise JudgeError(f"the score {raw!r} is not a number: {_excerpt(text)}") from None
    if not (math.isfinite(score) and low <= score <= high):
        raise JudgeError(f"the score {score:g} is outside [{low:g}, {high:g}]: {_excerpt(text)}")
    return score


class _Deadline:
    """One deadline for a whole request. A socket timeout bounds each read, so a server trickling a byte at a
    time could stall a request for ever; this watchdog shuts the connection's socket down when the deadline
    passes, which ends whatever read or write is in progress (the TLS handshake included)."""

    def __init__(self, timeout_s: float, conn: http.client.HTTPConnection):
        self.timeout_s = timeout_s
        self.expired = False
        self._conn, self._done, self._lock = conn, False, threading.Lock()
        self._timer = threading.Timer(timeout_s, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:  # never after cancel(): the socket may be closed and its number reused
            if self._done:
                return
            self.expired = True
            sock = getattr(self._conn, "sock", None)
            if sock is not None:
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, under TLS too
                except OSError:
                    pass

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def _read_body(response: http.client.HTTPResponse, url: str, cap: int, truncate: bool) -> bytes:
    """The body, read in chunks of at most :data:`_CHUNK_BYTES` and never more than ``cap + 1`` bytes in all.
    Beyond ``cap`` a JudgeError (``truncate``: cut at ``cap`` instead, an error page's excerpt); a body shorter
    than its Content-Length is a JudgeError too (``http.client`` returns it short)."""
    header = (response.getheader("Content-Length") or "").strip()
    declared = int(header) if header.isdigit() else None
    too_big = (f"{url} answered more than max_body_bytes={cap} bytes"
               f"{f' (Content-Length {declared})' if declared is not None else ''}; refused without reading it "
               "whole (make_judge(max_body_bytes=...) raises the cap)")
    if declared is not None and declared > cap and not truncate:
        raise JudgeError(too_big)
    chunks, total = [], 0
    while total <= cap:
        chunk = response.read1(min(_CHUNK_BYTES, cap + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > cap:
        if truncate:
            return b"".join(chunks)[:cap]
        raise JudgeError(too_big)
    if declared is not None and total < declared and not truncate:
        raise JudgeError(f"{url}: short body: {total} of {declared} bytes, then the connection closed "
                         "(IncompleteRead)")
    return b"".join(chunks)


def _transport_failure(url: str, err: Exception, connected: bool, deadline: _Deadline) -> str:
    """One line for a request that raised ``err`` (before the connection was up, or after)."""
    if deadline.expired or isinstance(err, TimeoutError):  # socket.timeout is a TimeoutError
        return (f"no complete answer from {url} within timeout_s={deadline.timeout_s:g} s (one deadline for "
                "the whole request)")
    if not connected:
        return f"cannot reach {url} ({type(err).__name__}: {err}); is the server (vllm serve ...) running?"
    return f"{url}: no valid HTTP answer ({type(err).__name__}: {_excerpt(err, 120)})"


def _exchange(url: str, payload: dict | None, timeout_s: float, api_key: str | None,
              max_body: int) -> tuple[int, str | None, bytes]:
    """One request to ``url`` (POST ``payload`` as JSON, or GET without it) under one deadline: its status,
    its Location header and its body (at most ``max_body`` bytes; an error page's first
    :data:`_ERROR_BODY_BYTES`). No redirect is followed and no proxy is used, so the bearer token goes to
    ``url``'s host only. Every failure is a one-line :class:`JudgeError` naming ``url``."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    headers = {"Accept": "application/json"}
    if payload is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = connection(parts.hostname, parts.port, timeout=timeout_s)
    deadline, connected, response = _Deadline(timeout_s, conn), False, None
    try:
        conn.connect()
        connected = True
        conn.request("GET" if payload is None else "POST", target,
                     body=None if payload is None else json.dumps(payload).encode(), headers=headers)
        response = conn.getresponse()
        ok = 200 <= response.status < 300
        body = _read_body(response, url, max_body if ok else _ERROR_BODY_BYTES, truncate=not ok)
        if deadline.expired:  # the watchdog's shutdown reads as an early end of the body
            raise TimeoutError
        return response.status, response.getheader("Location"), body
    except JudgeError as err:
        if deadline.expired:
            raise JudgeError(_transport_failure(url, TimeoutError(), connected, deadline)) from None
        raise err from None
    except Exception as err:  # noqa: BLE001 - OSError, http.client's errors, a bad chunk size: one message
        raise JudgeError(_transport_failure(url, err, connected, deadline)) from None
    finally:
        deadline.cancel()
        if response is not None:  # its file holds the socket open: a refused body must not keep coming
            response.close()
        conn.close()


def _request_json(url: str, payload: dict | None, timeout_s: float, api_key: str | None, max_body: int) -> Any:
    """:func:`_exchange`'s JSON answer; a :class:`JudgeError` for a status other than 2xx (a redirect named as
    such), a body that is not JSON, or JSON nested too deeply to read."""
    status, location, body = _exchange(url, payload, timeout_s, api_key, max_body)
    if 300 <= status < 400:
        raise JudgeError(f"{url} answered HTTP {status}, a redirect to {_excerpt(location, 120)}: the judge follows "
                         "no redirect (its key goes to base_url's host only); give make_judge the address that "
                         "answers")
    if not 200 <= status < 300:
        raise JudgeError(f"{url} answered HTTP {status}: {_excerpt(body)}")
    try:
        return json.loads(body)
    except RecursionError:
        raise JudgeError(f"{url} answered JSON nested too deeply to read ({len(body)} bytes)") from None
    except ValueError:  # a UnicodeDecodeError too
        raise JudgeError(f"{url} answered something that is not JSON: {_excerpt(body)}") from None


def _chat_text(url: str, answer: Any) -> tuple[str, Any]:
    """The chat answer's ``choices[0].message.content`` and ``finish_reason``; a JudgeError for another shape."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise JudgeError(f"{url} answered something that is not the chat API's (no choices[0].message.content): "
                         f"{_excerpt(answer)}")
    content = message.get("content")
    if not isinstance(content, str):
        raise JudgeError(f"{url}: its choices[0].message.content is {type(content).__name__}, not text: "
                         f"{_excerpt(message)}")
    return content, choice.get("finish_reason")


def _model_names(url: str, answer: Any) -> list:
    """The ids of ``GET /models``'s answer (``{"data": [{"id": ...}, ...]}``); a JudgeError for another shape."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise JudgeError(f"{url} answered a {type(answer).__name__}, not the model list ({{\"data\": [{{\"id\": "
                         f"...}}]}}): {_excerpt(answer)}")
    return [m.get("id") for m in data if isinstance(m, dict)]

def _template_fields(template: str) -> list[str]:
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"judge template: {{{bad[0]}}} is not a plain field name (write {{name}}; a literal brace "
                         "is {{ or }})")
    if "completion" not in names:
        raise ValueError("judge template: it must show the response, {completion}")
    return names


class Judge:
    """A judge made by :func:`make_judge` (module docstring); calling it scores a list of responses."""

    def __init__(self, base_url: str, model: str | None, template: str, pattern: str, min_score: float,
                 max_score: float, timeout_s: float, max_tokens: int, temperature: float,
                 system_prompt: str | None, concurrency: int, retries: int, api_key_env: str | None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.template, self.fields = template, _template_fields(template)
        self.pattern = re.compile(pattern)
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.timeout_s, self.max_tokens, self.temperature = float(timeout_s), int(max_tokens), float(temperature)
        self.system_prompt, self.concurrency, self.retries = system_prompt, int(concurrency), int(retries)
        self.api_key_env, self.max_body_bytes = api_key_env, int(max_body_bytes)
        #: responses this judge could not score in this process (each NaN, module docstring)
        self.failures = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Judge({self.base_url}, model={self.model!r})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        """One score per completion (TRL's ``reward_funcs`` call): NaN where that response's request failed,
        with one warning; a :class:`JudgeError` when every response failed, or the model list did."""
        if len(prompts) != len(completions):
            raise JudgeError(f"judge: {len(prompts)} prompts for {len(completions)} completions")
        texts = [self.user_message(i, prompts, completions, columns) for i in range(len(completions))]
        if not texts:
            return []
        try:
            self.served_model()  # once for the call: without a model no response can be graded
        except JudgeError as err:
            raise self._named(err) from None
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(texts))) as pool:
            return self._scores(list(pool.map(self._outcome, texts)))

    def _outcome(self, user_message: str) -> float | JudgeError:
        try:
            return self.grade(user_message)
        except JudgeError as err:
            return err

    def _scores(self, outcomes: list) -> list[float]:
        """The scores, NaN for each failed response (one warning); the first failure raised when all failed."""
        failed = [o for o in outcomes if isinstance(o, JudgeError)]
        with self._lock:
            self.failures += len(failed)
        if failed and len(failed) == len(outcomes):
            raise failed[0]
        if failed:
            log.warning("%d of %d responses got no score (NaN: under task=custom an error of that response alone); "
                        "%d in this process so far; the first: %s", len(failed), len(outcomes), self.failures,
                        failed[0])
        return [math.nan if isinstance(o, JudgeError) else o for o in outcomes]

    def user_message(self, i: int, prompts, completions, columns: dict) -> str:
        """The template filled for response ``i``."""
        values = {"prompt": show_prompt(prompts[i]) if "prompt" in self.fields else "",
                  "completion": show_completion(completions[i]),
                  "min_score": f"{self.min_score:g}", "max_score": f"{self.max_score:g}"}
        for name in self.fields:
            if name not in _BUILT_IN_FIELDS:
                if name not in columns:
                    raise JudgeError(f"judge template names {{{name}}}, which is not a column of the data "
                                     f"(columns: {sorted(columns)})")
                values[name] = columns[name][i]
        return self.template.format_map(values)

    def served_model(self) -> str:
        """``model``, or the one model the endpoint serves (``GET /models``) when it was given as None."""
        with self._lock:
            if self.model is None:
                url = f"{self.base_url}/models"
                names = _model_names(url, _request_json(url, None, self.timeout_s, self._api_key(),
                                                        self.max_body_bytes))
                if len(names) != 1 or not isinstance(names[0], str):
                    raise JudgeError(f"{url} lists {str(names)[:200]}, not one model name; give make_judge(model=...)")
                self.model = names[0]
            return self.model

    def _api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def grade(self, user_message: str) -> float:
        """Ask once (and ``retries`` more times on failure) and parse the score; the last failure is raised,
        naming the endpoint and the model."""
        for attempt in range(self.retries + 1):
            try:
                return self._ask(user_message)
            except JudgeError as err:
                if attempt == self.retries:
                    raise self._named(err) from None
        raise AssertionError("unreachable")

    def _named(self, err: JudgeError) -> JudgeError:
        return JudgeError(f"judge {self.model or '?'} at {self.base_url}: {err}")

    def _ask(self, user_message: str) -> float:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + \
            [{"role": "user", "content": user_message}]
        payload = {"model": self.served_model(), "messages": messages, "max_tokens": self.max_tokens,
                   "temperature": self.temperature}
        url = f"{self.base_url}/chat/completions"
        text, finish = _chat_text(url, _request_json(url, payload, self.timeout_s, self._api_key(),
                                                     self.max_body_bytes))
        try:
            return parse_score(text, self.pattern, self.min_score, self.max_score)
        except JudgeError as err:
            cut = " (it stopped at max_tokens: raise max_tokens)" if finish == "length" else ""
            raise JudgeError(f"{err}{cut}") from None


def make_judge(base_url: str, model: str | None = None, *, template: str = DEFAULT_TEMPLATE,
               pattern: str = DEFAULT_PATTERN, min_score: float = 0, max_score: float = 10,
               timeout_s: float = 60.0, max_tokens: int = 512, temperature: float = 0.0,
               system_prompt: str | None = None, concurrency: int = 8, retries: int = 0,
               api_key_env: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Judge:
    """A :class:`Judge` of the endpoint ``base_url`` (ending in ``/v1``; requests go to
    ``<base_url>/chat/completions``) and ``model`` (None: the one model it serves). ``api_key_env`` names an
    environment variable holding a bearer token, read at each request and sent to ``base_url``'s host only.
    ``max_body_bytes`` caps an answer's size. Bad settings raise ValueError naming the argument."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")) \
            or not urllib.parse.urlsplit(base_url).hostname:
        raise ValueError(f"make_judge(base_url={base_url!r}): expected http(s)://host:port/v1")
    for name, value in (("timeout_s", timeout_s), ("max_tokens", max_tokens), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"make_judge({name}={value!r}): expected a number > 0")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"make_judge(retries={retries!r}): expected an int >= 0")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"make_judge(max_body_bytes={max_body_bytes!r}): expected an int >= 1 (bytes; default "
                         f"{DEFAULT_MAX_BODY_BYTES})")
    if not min_score < max_score:
        raise ValueError(f"make_judge(min_score={min_score}, max_score={max_score}): expected min_score < max_score")
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        raise ValueError(f"make_judge(pattern={pattern!r}): not a regular expression ({err})") from None
    if groups < 1:
        raise ValueError(f"make_judge(pattern={pattern!r}): it needs a group around the number, e.g. Score: (\\d+)")
    return Judge(base_url, model, template, pattern, min_score, max_score, timeout_s, max_tokens, temperature,
                 system_prompt, concurrency, retries, api_key_env, max_body_bytes)
