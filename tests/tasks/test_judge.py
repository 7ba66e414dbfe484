"""The generative judge (arlopti/tasks/judge.py) against a stand-in of an OpenAI-compatible server that the test
starts (stdlib ``http.server`` on 127.0.0.1, in a thread), and TRL's reward-function convention that the custom
task calls it with (arlopti/tasks/custom.py, arlopti/tasks/user_code.py).

The stand-in answers by what the graded response asks for: ``[[score:N]]`` a reasoned answer ending in
``Score: N``, ``[[noscore]]`` an answer without one, ``[[slow]]`` nothing for 3 s, ``[[http500]]`` an error,
``[[notjson]]`` plain text, ``[[cut]]`` an answer stopped at ``max_tokens``. Nothing here touches the network
beyond 127.0.0.1."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from arlopti.config import ConfigError
from arlopti.tasks.custom import CustomTask, RewardFailureError
from arlopti.tasks.judge import JudgeError, make_judge
from arlopti.tasks.user_code import trl_convention

PROMPT = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Who is a knight?"}]


class StandIn(BaseHTTPRequestHandler):
    """``GET /v1/models`` and ``POST /v1/chat/completions`` as vLLM's OpenAI server answers them."""

    requests: list = []

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "stand-in-judge"}]}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.requests.append(payload)
        text = payload["messages"][-1]["content"]
        finish, content = "stop", "The answer is plausible."
        if "[[slow]]" in text:
            time.sleep(3)
        if "[[http500]]" in text:
            return self._send(500, b'{"error": "the judge model crashed"}')
        if "[[notjson]]" in text:
            return self._send(200, b"<html>proxy error</html>", "text/html")
        if m := re.search(r"\[\[score:(-?[\d.]+)\]\]", text):
            content = f"It names one person and is brief.\nScore: {m.group(1)}"
        if "[[cut]]" in text:
            finish, content = "length", "Let me think about every statement in turn, starting with"
        answer = {"id": "x", "object": "chat.completion", "model": payload["model"],
                  "choices": [{"index": 0, "finish_reason": finish,
                               "message": {"role": "assistant", "content": content}}]}
        self._send(200, json.dumps(answer).encode())


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that gave up ([[slow]]): nothing to report
        pass


@pytest.fixture(scope="module")
def server():
    httpd = Quiet(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def fresh_requests():
    StandIn.requests.clear()


def test_it_follows_trls_convention_and_scores_each_response(server):
    judge = make_judge(server, model="stand-in-judge")
    assert trl_convention(judge)
    scores = judge(prompts=[PROMPT, "Q: 2+2? A:"], completions=["Zoey [[score:7]]", " 4 [[score:10]]"],
                   ground_truth=["Zoey", "4"], trainer_state=None)  # TRL's extra keywords are accepted
    assert scores == [7.0, 10.0]
    assert len(StandIn.requests) == 2
    first = next(r for r in StandIn.requests if "Zoey" in r["messages"][-1]["content"])
    assert first["model"] == "stand-in-judge" and first["temperature"] == 0.0 and first["max_tokens"] == 512
    shown = first["messages"][-1]["content"]
    assert "system: Answer in one word.\nuser: Who is a knight?" in shown and "[Answer]\nZoey [[score:7]]" in shown
    assert "from 0 to 10" in shown
    assert judge(prompts=[], completions=[]) == []


def test_the_model_defaults_to_the_one_the_endpoint_serves(server):
    judge = make_judge(server)
    assert judge(prompts=[PROMPT], completions=["[[score:3]]"]) == [3.0]
    assert StandIn.requests[-1]["model"] == "stand-in-judge" and judge.model == "stand-in-judge"


def test_template_columns_and_a_chat_completion(server):
    judge = make_judge(server, model="m", template="Gold: {ground_truth}\nAnswer: {completion}", max_score=1)
    scores = judge(prompts=[PROMPT], completions=[[{"role": "assistant", "content": "Zoey [[score:1]]"}]],
                   ground_truth=["Zoey"])
    assert scores == [1.0] and StandIn.requests[-1]["messages"][-1]["content"] == "Gold: Zoey\nAnswer: Zoey [[score:1]]"
    with pytest.raises(JudgeError, match=r"names \{ground_truth\}, which is not a column of the data"):
        judge(prompts=[PROMPT], completions=["x"])


@pytest.mark.parametrize("completion,words", [
    ("Zoey [[noscore]]", ["no score in the answer", "The answer is plausible."]),
    ("Zoey [[score:42]]", ["the score 42 is outside [0, 10]"]),
    ("[[http500]]", ["answered HTTP 500", "the judge model crashed"]),
    ("[[notjson]]", ["not JSON", "proxy error"]),
    ("[[cut]]", ["no score in the answer", "it stopped at max_tokens: raise max_tokens"]),
    ("[[slow]]", ["no complete answer from", "within timeout_s=0.5 s"]),  # it gave up before the server answered
])
def test_a_bad_answer_or_a_timeout_is_a_one_line_error_never_a_number(server, completion, words, caplog):
    judge = make_judge(server, model="stand-in-judge", timeout_s=0.5)
    with pytest.raises(JudgeError) as err:  # every response of the call failed: the call raises
        judge(prompts=[PROMPT], completions=[completion])
    text = str(err.value)
    assert text.startswith(f"judge stand-in-judge at {server}: ") and "\n" not in text
    for w in words:
        assert w in text
    with caplog.at_level(logging.WARNING, logger="arlopti.tasks.judge"):  # beside a good answer: NaN there only
        scores = judge(prompts=[PROMPT, PROMPT], completions=["[[score:5]]", completion])
    assert scores[0] == 5.0 and math.isnan(scores[1])
    assert "1 of 2 responses got no score" in caplog.text and words[0] in caplog.text


def test_retries_ask_again_and_an_unreachable_server_is_named(server):
    judge = make_judge(server, model="stand-in-judge", retries=2)
    with pytest.raises(JudgeError, match="no score in the answer"):
        judge(prompts=[PROMPT], completions=["[[noscore]]"])
    assert len(StandIn.requests) == 3  # once, then two retries
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(JudgeError, match=rf"cannot reach http://127.0.0.1:{port}/v1/chat/completions"):
        make_judge(f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2)(prompts=[PROMPT], completions=["x"])


def test_bad_settings_name_the_argument():
    for kwargs, words in (({"base_url": "localhost:8000"}, "base_url"), ({"timeout_s": 0}, "timeout_s=0"),
                          ({"min_score": 5, "max_score": 1}, "min_score < max_score"),
                          ({"pattern": "Score: \\d+"}, "needs a group"), ({"pattern": "("}, "not a regular"),
                          ({"template": "{prompt}"}, "{completion}"), ({"retries": -1}, "retries=-1")):
        args = {"base_url": "http://127.0.0.1:1/v1", **kwargs}
        with pytest.raises(ValueError, match=re.escape(words)):
            make_judge(**args)


# ---- under task=custom -------------------------------------------------------------------------------

def _judge_file(tmp_path, server, **settings) -> str:
    path = tmp_path / "my_judge.py"
    args = "".join(f", {k}={v!r}" for k, v in settings.items())
    path.write_text(f"from arlopti.tasks.judge import make_judge\n\njudge = make_judge({server!r}{args})\n")
    return f"{path}:judge"


@pytest.mark.process


def test_the_custom_task_calls_it_in_a_worker_with_the_records_prompts(server, tmp_path):
    task = CustomTask(reward_fn=_judge_file(tmp_path, server, model="stand-in-judge"), num_workers=2)
    try:
        out = task.score(["Zoey [[score:7]]", "Liam [[score:2]]", "[[score:9]]"], ["Zoey"] * 3,
                         [{"prompt": PROMPT, "level": 1}] * 3)
    finally:
        task.close()
    assert task.functions[0].trl and [r.reward for r in out] == [7.0, 2.0, 9.0]
    assert all("user: Who is a knight?" in r["messages"][-1]["content"] for r in StandIn.requests)
    assert [r.components["error"] for r in out] == [0.0, 0.0, 0.0]


@pytest.mark.process


def test_under_the_custom_task_a_bad_answer_is_an_error_and_stops_the_run(server, tmp_path, caplog):
    spec = _judge_file(tmp_path, server, model="stand-in-judge", timeout_s=0.5)
    task = CustomTask(reward_fn=spec, num_workers=1, max_error_frac=1.0)
    try:
        out = task.score(["[[score:4]]", "[[slow]]"], [None] * 2, [{"prompt": PROMPT}] * 2)
    finally:
        task.close()
    # one call for both (one worker): the slow one alone counts as an error (reward/error), not as a judged 0
    assert [r.components["error"] for r in out] == [0.0, 1.0] and task.stats["error"] == 1
    assert [r.reward for r in out] == [4.0, 0.0]
    task = CustomTask(reward_fn=spec, num_workers=1)  # the default stop rule
    try:
        with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
            with pytest.raises(RewardFailureError) as err:  # every response failed: the call raised, named
                task.score(["[[noscore]]", "[[noscore]] again"], [None] * 2, [{"prompt": PROMPT}] * 2)
    finally:
        task.close()
    text = str(err.value)
    assert f"the reward function {spec} failed on 2 of 2 responses" in text and "\n" not in text
    assert "JudgeError: judge stand-in-judge at" in text and "no score in the answer" in text


def test_a_judge_object_from_python_runs_in_process_the_same_way(server):
    from arlopti.tasks.in_process import register_callable

    judge = make_judge(server, model="stand-in-judge")
    task = CustomTask(reward_fns=[register_callable(judge)], reward_weights=[0.5])
    try:
        out = task.score(["[[score:6]]", "[[score:8]]"], [None] * 2, [{"prompt": "Q: A:"}] * 2)
    finally:
        task.close()
    assert task.functions[0].in_process is not None and [r.reward for r in out] == [3.0, 4.0]
    assert task._pool is None  # nothing went to a worker


TRL_STYLE = '''
def sometimes(prompts, completions, ground_truth, **columns):
    """TRL's convention: None where the reward does not apply."""
    return [None if c == "skip" else float(c == g) + columns["level"][i] for i, (c, g) in
            enumerate(zip(completions, ground_truth))]


def length(response, ground_truth, meta):
    return len(response)


def scalar(prompts, completions, **columns):
    return 1.0
'''


@pytest.mark.process


def test_trl_convention_functions_get_lists_and_none_adds_nothing(tmp_path, caplog):
    (tmp_path / "trl_style.py").write_text(TRL_STYLE)
    task = CustomTask(reward_fns=[f"{tmp_path}/trl_style.py:sometimes", f"{tmp_path}/trl_style.py:length"],
                      reward_weights=[2.0, 1.0], num_workers=2)
    try:
        with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
            out = task.score(["4", "skip", "5"], ["4", "4", "4"], [{"prompt": "p", "level": 10}] * 3)
    finally:
        task.close()
    assert [f.trl for f in task.functions] == [True, False]
    assert [r.components["sometimes"] for r in out] == [11.0, 0.0, 10.0]
    assert [r.reward for r in out] == [2 * 11.0 + 1, 0.0 + 4, 2 * 10.0 + 1]
    assert [r.components["error"] for r in out] == [0.0, 0.0, 0.0]  # None is not an error ...
    assert task.stats["none:sometimes"] == 1 and "returned None" in caplog.text  # ... and not silent
    task = CustomTask(reward_fn=f"{tmp_path}/trl_style.py:scalar", num_workers=1)
    try:
        with pytest.raises(ConfigError, match=r"returned a float instead of a list.*one per completion: TRL's"):
            task.score(["a"], [None], [{"prompt": "p"}])
    finally:
        task.close()


def test_a_judge_that_cannot_import_is_refused_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="task.reward_fn"):
        CustomTask(reward_fn=f"{tmp_path}/nowhere.py:judge")
