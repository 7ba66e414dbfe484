"""The turn loop with its environment in worker processes (arlopti.rollout.turns over arlopti.tasks.env.workers):
an environment that exits or hangs takes down its own episodes only, the error rule decides what follows, a
hung step costs one timeout per round, the episodes are those of in-process calls, TRL's get_reward() may not
be NaN, and a step may return (reply, done). The last test runs train.py: a run stopped by its environment
saves its checkpoint first and says where."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.env_calls import InProcessEnvs
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env import EnvError, TextEnv
from arlopti.tasks.env.loading import register_env
from arlopti.tasks.env.workers import EnvWorkers
from helpers.turns import TOOL_TEMPLATE, ScriptedEngine, counting, turn_number
from helpers.worker_envs import Drawing, Exiting, Hanging, Scored, Shaped

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5, logprobs=True)


def batch_of(tok, metas: list[dict]):
    recs = [PromptRecord(uid=f"p/{i}", ground_truth=None, task="toy", meta=m,
                         messages=[{"role": "user", "content": f"Count {i}"}]) for i, m in enumerate(metas)]
    return collate_prompts(tokenize_records(recs, tok, 1024, "test")[0])


def loop_of(tok, env, timeout=30.0, frac=0.5, **rollout):
    cfg = RolloutConfig(**{"max_turns": 3, "max_new_tokens": 16, **rollout})
    return build_turn_loop(cfg, EnvConfig(env=register_env(env), env_timeout_s=timeout, max_error_frac=frac), tok)


def play(loop, tok, metas, group=2, say=counting, engine=None):
    engine = engine or ScriptedEngine(tok, say)
    batch = batch_of(tok, metas)
    return collect_groups(engine.generate, batch.prompt_ids, group, SAMPLING, turns=loop, batch=batch), engine


@pytest.fixture
def loops():
    made = []

    def make(*args, **kwargs):
        made.append(loop_of(*args, **kwargs))
        return made[-1]

    yield make
    for loop in made:
        loop.close()


def gone_within(pids, seconds: float = 30.0) -> bool:
    """Whether every process of ``pids`` is gone within ``seconds`` (a bound on waiting, not a measurement)."""
    end = time.monotonic() + seconds
    while any(os.path.exists(f"/proc/{p}") for p in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


DIED = "error: EnvWorkerDied: Exiting.step: the episode's environment process exited with code 3 during the call"


@pytest.mark.process


def test_an_environment_exiting_in_round_two_fails_its_episodes_and_the_error_rule_decides(tiny_tokenizer, loops):
    tok = tiny_tokenizer
    lenient = loops(tok, Exiting, frac=1.0, max_episode_tokens=512)  # room for the error reply
    assert isinstance(lenient.calls.runner, EnvWorkers)
    first, _ = play(lenient, tok, [{}, {}])
    assert all(e.meta["env_reward"] == 1.5 and e.meta["tool_errors"] == 0 for g in first for e in g)  # 3 steps
    second, _ = play(lenient, tok, [{"crash": True}, {}])  # round 2: prompt 0's steps call os._exit(3)
    for e in second[0]:  # its episodes failed with one line naming the class and the call; this process lives on
        assert DIED in e.meta["transcript"] and e.meta["tool_errors"] == 1 and e.meta["env_steps"] == 1
        assert e.meta["turns"] == 2 and e.meta["env_reward"] == 0.0  # the error reply, then the final turn
    assert all(e.meta["tool_errors"] == 0 and e.meta["env_reward"] == 1.5 for e in second[1])
    r = lenient.calls.recent[-1]
    assert (r.by_name["step"], r.failed_by_name["step"]) == (2 + 2 * 3, 2)
    third, _ = play(lenient, tok, [{}, {}])  # and the environment goes on in the next round
    assert all(e.meta["tool_errors"] == 0 for g in third for e in g)

    strict = loops(tok, Exiting, frac=0.2)  # round 1's 12 good steps stay in the window: 4 of 16 fail
    play(strict, tok, [{}, {}])
    with pytest.raises(EnvError, match=r"the environment Exiting: step failed on 4 of its 16 calls over the last 2 "
                                       r"rollout round\(s\) \(the last one so far.*First error of step: "
                                       r"EnvWorkerDied: Exiting.step: the episode's environment process exited with "
                                       r"code 3 during the call"):
        play(strict, tok, [{"crash": True}, {"crash": True}])


@pytest.mark.process


def test_every_episode_dying_stops_the_round_before_its_next_turn_is_generated(tiny_tokenizer, loops):
    tok = tiny_tokenizer
    loop = loops(tok, Exiting, frac=0.5)
    engine = ScriptedEngine(tok, counting)
    with pytest.raises(EnvError, match="step failed on 4 of its 4 calls"):
        play(loop, tok, [{"crash": True}, {"crash": True}], engine=engine)
    assert len(engine.calls) == 1  # turn 0 only: the rule was certain as the deaths came in


@pytest.mark.process


def test_a_hung_step_costs_one_timeout_a_round_its_calls_running_at_once(tiny_tokenizer, loops, tmp_path):
    """Four episodes' steps hang. Each step waits (at most 60 s) until all four have started and writes how
    many it saw: four each, so they ran at the same time (one at a time, the first would see one). Each
    episode times out once and is not called again; the round's four timeouts are one batch's."""
    tok = tiny_tokenizer
    loop = loops(tok, Hanging, timeout=10.0, frac=1.0)
    groups, engine = play(loop, tok, [{"dir": str(tmp_path), "n": 4}] * 2)
    assert sorted(p.read_text() for p in tmp_path.glob("*.saw")) == ["4"] * 4
    assert [(e.meta["tool_timeouts"], e.meta["env_steps"], e.meta["turns"]) for g in groups for e in g] == [(1, 1, 2)] * 4
    assert all("error: the call did not return within 10 s" in e.meta["transcript"] for g in groups for e in g)
    assert loop.calls.recent[-1].timeouts == 4 and loop.calls.runner.stats["timeouts"] == 4
    pids = [int(p.stem) for p in tmp_path.glob("*.started")]
    assert len(pids) == 4 and gone_within(pids)  # each killed at its deadline, not abandoned


@pytest.mark.process


def test_the_episodes_are_those_of_in_process_calls_and_repeat(tiny_tokenizer, loops):
    """Drawing draws from random in __init__, reset and step: the same seeds give the same episodes in the
    worker processes, again in a fresh loop (a resumed run), and in the trainer's process."""
    tok = tiny_tokenizer

    def episodes(loop):
        groups, _ = play(loop, tok, [{}, {}], group=3)
        return [(e.token_ids, e.meta["env_reward"], e.meta["transcript"], e.prompt_ids) for g in groups for e in g]

    workers = loops(tok, Drawing)
    local = loops(tok, Drawing)
    local.calls.runner = InProcessEnvs(Drawing, text=True)
    got = episodes(workers)
    assert isinstance(workers.calls.runner, EnvWorkers) and got == episodes(loops(tok, Drawing)) == episodes(local)
    assert len({tuple(p) for *_, p in got}) == 2  # the three episodes of a prompt share their first message


@pytest.mark.process


def test_trl_get_reward_nan_or_inf_stops_the_run_naming_the_environment():
    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    loop = loop_of(tok, Scored, frac=1.0)
    try:
        groups, _ = play(loop, tok, [{"reward": "0.25"}], say=lambda tok, ctx, seed: ("done", False))
        assert groups[0][0].meta["env_reward"] == 0.25
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(EnvError, match=rf"the environment Scored: get_reward returned a non-finite reward "
                                               rf"{bad} on prompt p/0"):
                play(loop, tok, [{"reward": bad}], say=lambda tok, ctx, seed: ("done", False))
    finally:
        loop.close()


@pytest.mark.process


def test_a_step_may_return_reply_and_done_and_other_shapes_are_still_refused(tiny_tokenizer, loops):
    tok = tiny_tokenizer
    loop = loops(tok, Shaped)
    say = lambda tok, ctx, seed: (f"t{turn_number(tok, ctx)}", False)  # noqa: E731
    groups, _ = play(loop, tok, [{"shape": "pair"}], say=say)
    e = groups[0][0]
    assert "again" in e.meta["transcript"] and e.meta["turns"] == 2 and e.meta["env_reward"] == 0.0
    assert e.meta["tool_errors"] == 0 and e.finish_reason == "stop"
    for shape in ("one", "four", "number", "text", "string_reward"):
        with pytest.raises(EnvError, match=r"the environment Shaped: step must return \(reply: str \| None, done: "
                                           r"bool, reward: float \| None\) or \(reply, done\), and returned"):
            play(loop, tok, [{"shape": shape}], say=say)


def test_a_class_no_worker_can_import_runs_in_the_trainer_s_process_and_says_so(tiny_tokenizer, caplog, loops):
    class Local(TextEnv):  # defined in a function: a fresh interpreter cannot import it by name
        def reset(self, row):
            return None

        def step(self, text):
            return None, True, 1.0

    with caplog.at_level(logging.WARNING, logger="arlopti.rollout.turns"):
        loop = loops(tiny_tokenizer, Local)
    assert isinstance(loop.calls.runner, InProcessEnvs)
    assert "environment test_a_class_no_worker_can_import_runs_in_the_trainer_s_process_and_says_so.<locals>.Local " \
           "runs in the trainer's process" in caplog.text
    groups, _ = play(loop, tiny_tokenizer, [{}])
    assert groups[0][0].meta["env_reward"] == 1.0


@pytest.mark.process


def test_a_worker_that_cannot_import_a_passed_class_falls_back_to_the_trainer_s_process(tiny_tokenizer, caplog,
                                                                                        loops):
    loop = loops(tiny_tokenizer, Exiting)
    loop.calls.runner = EnvWorkers("helpers.worker_envs:Gone", "Exiting", True)  # as if its module moved
    with caplog.at_level(logging.WARNING, logger="arlopti.rollout.env_calls"):
        groups, _ = play(loop, tiny_tokenizer, [{}])
    assert isinstance(loop.calls.runner, InProcessEnvs) and "so it runs in the trainer's process" in caplog.text
    assert groups[0][0].meta["env_reward"] == 1.5
    loop.calls.runner, loop.calls.fallback = EnvWorkers("helpers.worker_envs:Gone", "Exiting", True), None
    with pytest.raises(EnvError, match=r"the environment Exiting: its worker process could not import it "
                                       r"\(.*helpers.worker_envs:Gone"):
        play(loop, tiny_tokenizer, [{}])


ENV_FILE = '''
    import os
    from arlopti.tasks.env import TextEnv


    class Exiting(TextEnv):
        """Replies "then " to every turn; from the second round's resets on, its step calls os._exit(3)."""

        def reset(self, row):
            with open(os.environ["RESETS_FILE"], "a") as f:
                f.write("reset\\n")
            return None

        def step(self, text):
            with open(os.environ["RESETS_FILE"]) as f:
                if len(f.readlines()) > 8:  # 2 prompts x 4 episodes a round: round 2 has begun
                    os._exit(3)
            return "then ", False, 0.0
'''


@pytest.mark.slow
def test_train_py_stopped_by_an_exiting_environment_saves_its_checkpoint_and_says_where(tmp_path):
    import torch

    from conftest import REPO_ROOT

    (tmp_path / "env.py").write_text(textwrap.dedent(ENV_FILE))
    (tmp_path / "rewards.py").write_text("def score(response, ground_truth, meta):\n    return 0.0\n")
    (tmp_path / "train.jsonl").write_text("".join(f'{{"prompt": "Round {i}.", "answer": "{i}"}}\n' for i in range(6)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RESETS_FILE=str(tmp_path / "resets"))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), "task=custom", "task.reward_fn=rewards.py:score",
                           "task.env=env.py:Exiting", "rollout.max_turns=3", 'rollout.stop=[" "]', "data=prompts",
                           "data.train_file=train.jsonl", "debug=smoke", "rollout_steps=3", "logger=csv",
                           "callbacks.benchmark_eval=null", "task.error_window=1", f"paths.log_dir={tmp_path}/logs",
                           f"hydra.run.dir={tmp_path}/run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # the run's one-line failure, not the environment's exit code 3
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("EnvError: ")]
    assert "the environment Exiting: step failed on" in line and "task.max_error_frac=0.5" in line  # round 2 alone
    assert "First error of step: EnvWorkerDied: Exiting.step: the episode's environment process exited with code 3" \
           in line
    done, where = re.search(r"The (\d+) rollout step\(s\) done are saved in (\S+last\.ckpt): resume with the same "
                            r"command plus ckpt_path=last once the environment is fixed\.", line).groups()
    assert done == "1" and torch.load(where, map_location="cpu", weights_only=False)["arlopti"]["rollout_step"] == 1
    assert "step 1/3" in out
