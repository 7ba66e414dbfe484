"""A generative judge: a reward function that asks an OpenAI-compatible chat endpoint to grade each response.

The endpoint is any server of the OpenAI chat API: ``vllm serve <model>`` (``http://127.0.0.1:8000/v1``), or
this project's rollout worker (``python -m arlopti.rollout.serve``, which runs vLLM's OpenAI server: its
``/v1/chat/completions`` answers with the policy being trained). Only the standard library talks to it
(``urllib.request``), one request per response, ``concurrency`` at a time.

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
is not the chat API's JSON, an answer without a score or with a score outside the range each raise
:class:`JudgeError`, one line naming the endpoint, the model and what came back. Under ``task=custom`` the call
(one chunk of responses) then counts as failed for its responses (``reward/error``), and past
``task.max_error_frac`` the run stops naming the judge; ``retries`` (default 0) asks again before raising.
Keep ``timeout_s`` within ``task.timeout_s`` (the task kills a call of ``k`` responses after
``k * task.timeout_s`` seconds, which counts as a timeout).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import string
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

DEFAULT_TEMPLATE = (
    "You grade an assistant's answer to a request.\n\n"
    "[Request]\n{prompt}\n\n"
    "[Answer]\n{completion}\n\n"
    "Judge how correct, helpful and clear the answer is. Explain briefly, then end with a line "
    "'Score: N', N an integer from {min_score} to {max_score} ({max_score} is best)."
)
DEFAULT_PATTERN = r"Score:\s*\**\s*(-?\d+(?:\.\d+)?)"
_BUILT_IN_FIELDS = ("prompt", "completion", "min_score", "max_score")


class JudgeError(RuntimeError):
    """The judge could not give a score (the message, one line, says why); never turned into a number."""


def _excerpt(text: Any, n: int = 200) -> str:
    """A one-line excerpt of ``text`` (its repr, cut to ``n`` characters)."""
    return repr(str(text)[:n]) + ("..." if len(str(text)) > n else "")


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


def _post_json(url: str, payload: dict | None, timeout_s: float, api_key: str | None) -> dict:
    """POST (or GET, without ``payload``) ``url`` and its JSON answer; :class:`JudgeError` for a timeout, a
    refused connection, an HTTP error or an answer that is not JSON."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="GET" if payload is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        raise JudgeError(f"{url} answered HTTP {err.code}: {_excerpt(err.read().decode(errors='replace'))}") from None
    except (TimeoutError, socket.timeout):
        raise JudgeError(f"no answer from {url} within timeout_s={timeout_s:g} s") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, (TimeoutError, socket.timeout)):
            raise JudgeError(f"no answer from {url} within timeout_s={timeout_s:g} s") from None
        raise JudgeError(f"cannot reach {url} ({err.reason}); is the server (vllm serve ...) running?") from None
    try:
        return json.loads(body)
    except ValueError:
        raise JudgeError(f"{url} answered something that is not JSON: {_excerpt(body.decode(errors='replace'))}") \
            from None


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
                 system_prompt: str | None, concurrency: int, retries: int, api_key_env: str | None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.template, self.fields = template, _template_fields(template)
        self.pattern = re.compile(pattern)
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.timeout_s, self.max_tokens, self.temperature = float(timeout_s), int(max_tokens), float(temperature)
        self.system_prompt, self.concurrency, self.retries = system_prompt, int(concurrency), int(retries)
        self.api_key_env = api_key_env
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Judge({self.base_url}, model={self.model!r})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        """One score per completion (TRL's ``reward_funcs`` call); raises :class:`JudgeError` if any fails."""
        if len(prompts) != len(completions):
            raise JudgeError(f"judge: {len(prompts)} prompts for {len(completions)} completions")
        texts = [self.user_message(i, prompts, completions, columns) for i in range(len(completions))]
        if not texts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(texts))) as pool:
            return list(pool.map(self.grade, texts))

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
                answer = _post_json(f"{self.base_url}/models", None, self.timeout_s, self._api_key())
                names = [m.get("id") for m in answer.get("data", []) if isinstance(m, dict)]
                if len(names) != 1:
                    raise JudgeError(f"judge: {self.base_url}/models lists {names}; give make_judge(model=...) one")
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
                    raise JudgeError(f"judge {self.model or '?'} at {self.base_url}: {err}") from None
        raise AssertionError("unreachable")

    def _ask(self, user_message: str) -> float:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + \
            [{"role": "user", "content": user_message}]
        payload = {"model": self.served_model(), "messages": messages, "max_tokens": self.max_tokens,
                   "temperature": self.temperature}
        answer = _post_json(f"{self.base_url}/chat/completions", payload, self.timeout_s, self._api_key())
        try:
            choice = answer["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"the answer is not the chat API's (no choices[0].message.content): {_excerpt(answer)}") \
                from None
        try:
            return parse_score(text, self.pattern, self.min_score, self.max_score)
        except JudgeError as err:
            cut = " (it stopped at max_tokens: raise max_tokens)" if choice.get("finish_reason") == "length" else ""
            raise JudgeError(f"{err}{cut}") from None


def make_judge(base_url: str, model: str | None = None, *, template: str = DEFAULT_TEMPLATE,
               pattern: str = DEFAULT_PATTERN, min_score: float = 0, max_score: float = 10,
               timeout_s: float = 60.0, max_tokens: int = 512, temperature: float = 0.0,
               system_prompt: str | None = None, concurrency: int = 8, retries: int = 0,
               api_key_env: str | None = None) -> Judge:
    """A :class:`Judge` of the endpoint ``base_url`` (ending in ``/v1``; requests go to
    ``<base_url>/chat/completions``) and ``model`` (None: the one model it serves). ``api_key_env`` names an
    environment variable holding a bearer token, read at each request. Bad settings raise ValueError naming
    the argument."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"make_judge(base_url={base_url!r}): expected http(s)://host:port/v1")
    for name, value in (("timeout_s", timeout_s), ("max_tokens", max_tokens), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"make_judge({name}={value!r}): expected a number > 0")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"make_judge(retries={retries!r}): expected an int >= 0")
    if not min_score < max_score:
        raise ValueError(f"make_judge(min_score={min_score}, max_score={max_score}): expected min_score < max_score")
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        raise ValueError(f"make_judge(pattern={pattern!r}): not a regular expression ({err})") from None
    if groups < 1:
        raise ValueError(f"make_judge(pattern={pattern!r}): it needs a group around the number, e.g. Score: (\\d+)")
    return Judge(base_url, model, template, pattern, min_score, max_score, timeout_s, max_tokens, temperature,
                 system_prompt, concurrency, retries, api_key_env)
