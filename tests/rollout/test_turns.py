"""The turn loop (arlopti.rollout.turns) on scripted rollouts: the ids, the masks, the limits, the failures."""

from __future__ import annotations

import time

import pytest

from arlopti.config import ConfigError, RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.chat_encoding import ChatEncoding
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.retokenization import Conversation, drift, retokenization_drift
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env import EnvError, TextEnv
from arlopti.tasks.env.loading import register_env
from helpers.turns import CountEnv, NullEnv, ScriptedEngine, bpe_ids, char_ids, counting, turn_number

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5, logprobs=True)


def batch_of(tok, n: int = 2, text: bool = False):
    recs = [PromptRecord(uid=f"p/{i}", ground_truth=str(i), task="toy", meta={"target": i},
                         **({"text": f"Count {i}:"} if text else {"messages": [{"role": "user", "content": f"Count {i}"}]}))
            for i in range(n)]
    return collate_prompts(tokenize_records(recs, tok, 512, "test")[0])


def run(tok, env, say=counting, group=2, batch=None, sampling=SAMPLING, **rollout):
    timeout, frac = rollout.pop("timeout", 5.0), rollout.pop("error_frac", 0.5)
    cfg = RolloutConfig(**{"max_turns": 4, "max_new_tokens": 16, **rollout})
    loop = build_turn_loop(cfg, EnvConfig(env=register_env(env), env_timeout_s=timeout, max_error_frac=frac), tok)
    engine = ScriptedEngine(tok, say)
    batch = batch or batch_of(tok)
    groups = collect_groups(engine.generate, batch.prompt_ids, group, sampling, turns=loop, batch=batch)
    return groups, engine, loop


@pytest.mark.process


def test_the_trained_ids_are_the_sampled_ids_and_the_encoded_replies(tiny_tokenizer):
    tok = tiny_tokenizer
    groups, engine, _ = run(tok, CountEnv)
    enc = ChatEncoding(tok)
    batch = batch_of(tok)
    for i, group in enumerate(groups):
        for j, e in enumerate(group):
            # rebuild the episode from the engine's own outputs and the replies encoded once each
            ctx, want, mask, lps = list(batch.prompt_ids[i]), [], [], []
            for k in range(3):  # every episode runs 3 turns: call k >= 1 holds them all, in step order
                prompts, _, _, outs = engine.calls[k]
                row = i if k == 0 else 2 * i + j
                assert prompts[row] == ctx  # the context the engine got: the episode so far, as ids
                c = outs[row][j if k == 0 else 0]
                want += c.token_ids
                mask += [1] * len(c.token_ids)
                lps += c.logprobs
                ctx += c.token_ids
                if k < 2:
                    reply = enc.reply_ids([{"role": "user", "content": f"ok {k + 1}"}])
                    want, mask, lps, ctx = want + reply, mask + [0] * len(reply), lps + [0.0] * len(reply), ctx + reply
            assert e.token_ids == want and e.trainable == mask and e.logprobs == lps
            assert e.text == "done" and e.finish_reason == "stop" and e.meta["turns"] == 3
            assert e.meta["env_reward"] == 1.5 and e.meta["env_steps"] == 3 and e.meta["env_tokens"] == mask.count(0)
            assert e.meta["tool_calls"] == 0  # a text environment's steps are no tool calls
            # one character per token never survives decode + encode: the drift a re-tokenizing loop would train on
            assert e.meta["retokenize_diff"] == 1
            assert "[[env]]" in e.meta["transcript"] and e.prompt_ids is None
    # turn 0 is the single-turn call (G per prompt, the round's seed); later turns one request per episode
    assert [(len(p), n) for p, n, _, _ in engine.calls] == [(2, 2), (4, 1), (4, 1)]
    assert engine.calls[1][2].seed != SAMPLING.seed


def test_drift_counts_the_span_between_the_first_and_the_last_difference():
    assert drift([1, 2, 3], [1, 2, 3]) == (False, 0)
    assert drift([1, 2, 3, 4, 5], [1, 2, 9, 9, 9, 5]) == (True, 3)  # the longer side 6, prefix 2, suffix 1
    assert drift([1, 2], [1, 2, 3]) == (True, 1) and drift([7, 1], [1]) == (True, 1)
    assert drift([1, 1], [1, 1, 1]) == (True, 1)  # the suffix does not overlap the prefix

    class Refusing:  # a chat template that raises on the conversation renders nothing: every token differs
        has_template, special = True, set()

        class tokenizer:
            def apply_chat_template(*args, **kwargs):
                raise ValueError("Conversation roles must alternate user/assistant/user/assistant")

    assert retokenization_drift(Refusing, Conversation([{"role": "user", "content": "x"}]), [1], [2, 3]) == (True, 3)


@pytest.mark.process


def test_the_retokenization_metric_re_renders_the_whole_conversation(tiny_tokenizer):
    """Turns spelled as the tokenizer encodes them re-render to the trained ids (prompt, turns, replies; a last
    turn cut at its limit too); one turn spelled otherwise differs over that turn only."""
    tok = tiny_tokenizer

    def measured(encode, say=counting, **rollout):
        cfg = RolloutConfig(**{"max_turns": 4, "max_new_tokens": 16, **rollout})
        loop = build_turn_loop(cfg, EnvConfig(env=register_env(CountEnv)), tok)
        batch = batch_of(tok)
        groups = collect_groups(ScriptedEngine(tok, say, encode).generate, batch.prompt_ids, 2, SAMPLING, turns=loop,
                                batch=batch)
        return {(e.meta["retokenize_diff"], e.meta["retokenize_diff_tokens"]) for g in groups for e in g}

    assert measured(bpe_ids) == {(0, 0)}
    def cut(tok, ctx, seed):  # the second turn passes its 6 tokens
        return ("t0" if turn_number(tok, ctx) == 0 else "the end of a long answer"), False

    assert measured(bpe_ids, cut, max_turns=2, max_new_tokens=6, max_episode_tokens=60) == {(0, 0)}
    odd = lambda tok, text: (char_ids if text == "done" else bpe_ids)(tok, text)  # noqa: E731
    eos = [tok.eos_token_id]
    span = drift(char_ids(tok, "done") + eos, bpe_ids(tok, "done") + eos)
    assert span[0] and measured(odd) == {(1, span[1])}


@pytest.mark.process


def test_one_turn_with_an_environment_samples_the_single_turn_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    batch = batch_of(tok)
    groups, _, _ = run(tok, NullEnv, max_turns=1, batch=batch)
    plain = collect_groups(ScriptedEngine(tok, counting).generate, batch.prompt_ids, 2, SAMPLING)
    assert [[e.token_ids for e in g] for g in groups] == [[e.token_ids for e in g] for g in plain]
    assert [[e.logprobs for e in g] for g in groups] == [[e.logprobs for e in g] for g in plain]
    assert all(e.meta["turns"] == 1 and e.meta["env_reward"] == 0.0 for g in groups for e in g)


def test_a_turn_ended_by_a_stop_string_is_continued_as_plain_text(tiny_tokenizer):
    tok = tiny_tokenizer

    def say(tok, ctx, seed):
        text = tok.decode(ctx, skip_special_tokens=False)
        return ("x=1```output", True) if "```output" not in text else ("done", False)

    class Run(TextEnv):
        def reset(self, row):
            return None

        def step(self, text):
            return ("\n1\n```\n", False, None) if text.endswith("```output") else (None, True, None)

    (group, _), _, _ = run(tok, Run, say=say)
    e = group[0]
    reply = ChatEncoding(tok).text_ids("\n1\n```\n")
    first = char_ids(tok, "x=1```output")
    assert e.token_ids == first + reply + char_ids(tok, "done") + [tok.eos_token_id]
    assert e.trainable == [1] * len(first) + [0] * len(reply) + [1] * 5


@pytest.mark.process


def test_the_hf_engine_s_turns_ended_by_a_stop_string_keep_one_log_prob_per_token(tiny_model, tiny_tokenizer):
    """The HF engine stops a row on a stop string while the others go on (generate() pads it); each turn's
    log-probs must stay one per kept token, or every later turn's are misaligned (docs/multi_turn.md's
    example failed: 'an episode has 40 log-probs for 24 tokens')."""
    from arlopti.rollout.hf import HFEngine

    tok = tiny_tokenizer
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, stop=[" "], max_episode_tokens=96)
    loop = build_turn_loop(cfg, EnvConfig(env=register_env(CountEnv)), tok)
    batch = batch_of(tok)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=5, logprobs=True, stop=(" ",))
    groups = collect_groups(HFEngine(tiny_model, tok).generate, batch.prompt_ids, 4, sampling, turns=loop, batch=batch)
    episodes = [e for g in groups for e in g]
    assert max(e.meta["turns"] for e in episodes) > 1
    for e in episodes:
        assert len(e.logprobs) == len(e.token_ids)
        assert all((lp == 0.0) != bool(m) for lp, m in zip(e.logprobs, e.trainable))  # 0.0 exactly on the replies


@pytest.mark.process


def test_a_reply_that_would_pass_the_episode_limit_is_rolled_back(tiny_tokenizer):
    tok = tiny_tokenizer
    (group, _), engine, _ = run(tok, CountEnv, max_episode_tokens=12)
    e = group[0]
    first = engine.calls[0][3][0][0].token_ids
    assert e.token_ids == first and e.trainable == [1] * len(first)  # the reply was not appended
    assert e.finish_reason == "length" and e.meta["episode_limit"] == 1 and e.meta["turns"] == 1
    assert len(engine.calls) == 1  # nothing ran on


@pytest.mark.process


def test_a_later_turn_is_cut_to_what_the_episode_has_left(tiny_tokenizer):
    tok = tiny_tokenizer
    long = lambda tok, ctx, seed: ("t" if turn_number(tok, ctx) == 0 else "u" * 30, False)  # noqa: E731
    (group, _), engine, _ = run(tok, CountEnv, say=long, max_episode_tokens=24, max_new_tokens=16)
    e = group[0]
    assert len(e.token_ids) == 24 and e.finish_reason == "length" and e.meta["turns"] == 2
    reply = e.trainable.count(0)
    assert engine.calls[1][2].max_new_tokens == 24 - 2 - reply < 16  # the episode's budget, not the turn's 16


@pytest.mark.process


def test_the_last_allowed_turn_ends_the_episode_and_says_so(tiny_tokenizer):
    (group, _), engine, _ = run(tiny_tokenizer, CountEnv, max_turns=2)
    e = group[0]
    assert e.meta["turns"] == 2 and e.meta["turn_limit"] == 1 and e.finish_reason == "stop"
    assert e.trainable[-1] == 1  # no reply after the last turn


class Faulty(TextEnv):
    """Turn 0 raises, turn 1 returns a huge reply, turn 2 hangs."""

    def reset(self, row):
        self.n = 0
        return None

    def step(self, text):
        self.n += 1
        if self.n == 1:
            raise ValueError("the tool broke")
        if self.n == 2:
            return "y" * 100_000, False, None
        time.sleep(3)
        return "late", False, None


@pytest.mark.process


def test_a_tool_that_raises_returns_too_much_or_hangs_gives_an_error_reply_and_is_counted(tiny_tokenizer):
    tok = tiny_tokenizer
    say = lambda tok, ctx, seed: (f"t{turn_number(tok, ctx)}", False)  # noqa: E731
    (group,), engine, loop = run(tok, Faulty, say=say, group=1, batch=batch_of(tok, 1), timeout=0.3,
                                   max_reply_tokens=64, max_episode_tokens=400, error_frac=1.0)
    e = group[0]
    text = tok.decode(e.token_ids, skip_special_tokens=False)
    assert "error: ValueError: the tool broke" in text
    assert "error: the reply was too long (100000 characters; the limit is 64 tokens)" in text
    assert "error: the call did not return within 0.3 s" in text
    assert e.meta["turns"] == 4 and e.meta["tool_errors"] == 2 and e.meta["tool_timeouts"] == 1
    assert e.finish_reason == "stop" and e.meta["env_steps"] == 3  # after the hang the env is not called again
    r = loop.calls.recent[-1]
    assert (r.by_name["step"], r.failed_by_name["step"]) == (3, 3)  # each failed (the second: its reply was refused)
    assert (r.by_name["reset"], r.failed_by_name["reset"]) == (1, 0)


def test_too_many_failures_stop_the_run_naming_the_environment(tiny_tokenizer):
    tok = tiny_tokenizer

    class Broken(TextEnv):
        def reset(self, row):
            return None

        def step(self, text):
            raise RuntimeError("no database")

    cfg = RolloutConfig(max_turns=2, max_new_tokens=16)
    loop = build_turn_loop(cfg, EnvConfig(env=register_env(Broken), max_error_frac=0.5), tok)
    batch = batch_of(tok)
    with pytest.raises(EnvError, match=r"Broken: step failed on 4 of its 4 calls over the last 1 rollout round\(s\), "
                                       r"more than task.max_error_frac=0.5 \(every call: step 4 of 4, reset 0 of 4\)"
                                       r".*First error of step: RuntimeError: no database"):
        collect_groups(ScriptedEngine(tok, counting).generate, batch.prompt_ids, 2, SAMPLING, turns=loop,
                       batch=batch)


def test_the_group_starts_from_one_state(tiny_tokenizer):
    tok = tiny_tokenizer
    import itertools
    import random

    class Drawn(TextEnv):
        def reset(self, row):
            self.target = random.randint(1, 10 ** 9)  # seeded per prompt: the G resets agree
            return f"target {self.target}"

        def step(self, text):
            return None, True, None

    groups, engine, _ = run(tok, Drawn, max_turns=1, group=3)
    firsts = [tok.decode(e.prompt_ids) for g in groups for e in g]
    assert firsts[0] == firsts[1] == firsts[2] != firsts[3] and "target" in firsts[0]
    counter = itertools.count()

    class Unseeded(TextEnv):
        def reset(self, row):
            return f"target {next(counter)}"

        def step(self, text):
            return None, True, None

    with pytest.raises(EnvError, match="must start from the same state"):
        run(tok, Unseeded, max_turns=1)


def test_bad_settings_are_refused(tiny_tokenizer):
    with pytest.raises(ConfigError, match=r"rollout.max_turns=3: more than one turn needs an environment"):
        build_turn_loop(RolloutConfig(max_turns=3), EnvConfig(), tiny_tokenizer)
    with pytest.raises(ConfigError, match=r"rollout.max_episode_tokens=99 limits a multi-turn episode"):
        build_turn_loop(RolloutConfig(max_episode_tokens=99), EnvConfig(), tiny_tokenizer)
    with pytest.raises(EnvError, match=r"prompt p/0 is raw text.*data=kk / kk_generated: data.template=qwen-instruct; "
                                       r"data=deepscaler / dsr_uniform / orz: data.template=chat; "
                                       r"data=prompts / verl_parquet: data.chat_template=true"):
        class First(TextEnv):
            def reset(self, row):
                return "hello"

            def step(self, text):
                return None, True, None

        run(tiny_tokenizer, First, batch=batch_of(tiny_tokenizer, text=True))
    with pytest.raises(EnvError, match="step must return"):
        class Bad(TextEnv):
            def reset(self, row):
                return None

            def step(self, text):
                return "just text"

        run(tiny_tokenizer, Bad)


@pytest.mark.process


def test_validation_runs_the_episodes_too(tiny_tokenizer):
    """evaluate_sets with the run's turn loop (callbacks.benchmark_eval passes it): the task scores the final
    turn, and the environment's reward is added."""
    from arlopti.eval.runner import EvalMode, evaluate_sets
    from arlopti.prompts.records import tokenize_records
    from arlopti.tasks.base import RewardResult, Task

    class Done(Task):
        def score(self, responses, ground_truths, metas):
            return [RewardResult(float(r == "done"), r == "done") for r in responses]

    tok = tiny_tokenizer
    recs = [PromptRecord(uid=f"v/{i}", ground_truth=None, task="toy", messages=[{"role": "user", "content": "go"}])
            for i in range(3)]
    samples = tokenize_records(recs, tok, 512, "val")[0]
    loop = build_turn_loop(RolloutConfig(max_turns=4, max_new_tokens=16), EnvConfig(env=register_env(CountEnv)), tok)
    engine = ScriptedEngine(tok, counting)
    modes = {"toy": (EvalMode("sampling", temperature=1.0, n=2),)}
    metrics, _ = evaluate_sets(engine, {"val": samples}, modes, lambda name: Done(), 16, seed=1, turns=loop)
    assert metrics["val/toy/val/sampling/avg@2"] == 1.0  # every final turn says done
    assert metrics["val/toy/val/sampling/reward"] == 1.0 + 1.5  # the task's 1 plus the environment's 0.25 + 0.25 + 1
    plain, _ = evaluate_sets(ScriptedEngine(tok, counting), {"val": samples}, modes, lambda name: Done(), 16, seed=1)
    assert plain["val/toy/val/sampling/avg@2"] == 0.0  # one response: the first turn, t0<letter>
