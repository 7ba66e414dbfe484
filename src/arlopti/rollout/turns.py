"""Multi-turn episodes: the turn loop between the policy's generator and an environment (``task.env``).

:class:`TurnLoop` is what :func:`arlopti.rollout.source.collect_groups` runs when the run has an
environment; every rollout source (HF, colocated vLLM with token-id prompts, the rollout workers with
token ids over their route) hands it its own ``generate`` and nothing else changes. Without an
environment ``collect_groups`` makes its one generation call, as before.

One round (:meth:`TurnLoop.run`), for a step's prompts and ``G`` episodes each:

1. **start**: ``G`` environment instances per prompt (one worker process each, or in the trainer's process:
   :mod:`arlopti.rollout.env_calls`), all reset at once on their prompt's record (the row:
   :func:`episode_prompts`), with Python's ``random`` seeded the same for the ``G`` of a prompt; their first
   messages must agree. The prompt is re-rendered
   from its messages when the environment adds a first message or tools
   (:class:`~arlopti.rollout.chat_encoding.ChatEncoding`; :mod:`arlopti.tasks.env.base` says how),
   else its ids are kept as they are;
2. **turn 0** is the single-turn call itself: ``generate(prompts, G, sampling)`` with the round's
   seeds, so a one-turn episode samples exactly the tokens a plain response would;
3. **after each model turn**, per episode: a turn cut at its token limit ends the episode
   (truncated); else the environment answers (the text contract's ``step``; TRL's: the turn's tool
   calls, in order, a turn with none ends the episode), the running episodes' calls in one batch
   (:meth:`~arlopti.rollout.env_calls.EnvCalls.run`: at the same time on the worker processes). ``done``,
   no reply, or the last of ``rollout.max_turns`` turns ends it; a call that raised, timed out or lost its
   process gives an error reply (after the last two the environment is not called again: the next turn
   is final); before the next turn is generated the stop rule is checked where already certain
   (:meth:`~arlopti.rollout.env_calls.EnvCalls.check`); else the reply is encoded
   (:meth:`~arlopti.rollout.chat_encoding.ChatEncoding.reply_ids`) and appended with trainable 0 and
   log-prob 0.0. A reply over ``rollout.max_reply_tokens`` tokens is replaced by an error reply; one
   that would leave no room for a token of the next turn within ``rollout.max_episode_tokens`` is
   rolled back (TRL's rule: not appended) and the episode ends, truncated;
4. **turn t >= 1**: one ``generate(contexts, 1, sampling)`` over the episodes still running, in step
   order, seeded by :func:`arlopti.rollout.seeds.turn_seed`; each context is the prompt, the sampled
   ids and the encoded replies so far (never decoded and encoded again). Its token limit is the
   largest of the running episodes' budgets ``min(rollout.max_new_tokens, episode tokens left)``, and
   each turn is cut to its own budget afterwards (TRL's rule), a cut turn ending its episode
   truncated. With ``lockstep`` (HF under FSDP2, whose ``generate`` gathers the weights with the
   other ranks) every rank makes all ``max_turns`` calls, empty ones included.

The episode (:class:`~arlopti.rollout.episode.Episode`): ``token_ids`` = turn 0 ⊕ reply 1 ⊕ turn 1 ⊕ ...,
``trainable`` 1 on sampled ids, ``text`` = the final model turn (what the task scores), ``prompt_ids``
when the environment re-rendered the prompt, and in ``meta``: ``turns``, ``tool_calls`` (TRL's tool calls),
``env_steps`` (the text contract's steps), ``tool_errors``, ``tool_timeouts`` (failed calls of either kind), ``env_tokens``, ``env_reward``
(the sum of the steps' rewards, or TRL's ``get_reward()``, all the round's in one batch), ``episode_limit`` (1: rolled back at the
episode limit), ``turn_limit`` (1: a reply was due after the last allowed turn), ``retokenize_diff``
(1: the conversation re-rendered by the chat template and encoded differs from the prompt and the
episode's ids) and ``retokenize_diff_tokens`` (the length of the span where they differ;
:mod:`arlopti.rollout.retokenization`), ``env_s`` (the episode's share of the wall seconds the round's
batches of environment calls took, in proportion to its calls' own seconds: the episodes' sum is the
environment's wall time) and ``transcript`` (the episode as text, the environment's parts between ``[[env]]`` and
``[[/env]]``). :func:`with_env_rewards` adds ``env_reward`` to the task's reward.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from arlopti.config import ConfigError
from arlopti.prompts.chat_form import chat_form_hint
from arlopti.rollout.chat_encoding import ChatEncoding
from arlopti.rollout.engine import Completion, SamplingConfig
from arlopti.rollout.env_calls import CallResult, EnvCall, EnvCalls, InProcessEnvs
from arlopti.rollout.episode import Episode
from arlopti.rollout.retokenization import Conversation, retokenization_drift
from arlopti.rollout.seeds import env_seed, turn_seed
from arlopti.tasks.base import RewardResult
from arlopti.tasks.env.base import EnvError, check_reward, check_step_value
from arlopti.tasks.env.loading import EnvSpec, load_env
from arlopti.tasks.env.tools import parse_tool_calls

#: A reply of more than this many characters per allowed token is refused before it is encoded.
CHARS_PER_TOKEN_BOUND = 8
ENV_OPEN, ENV_CLOSE = "[[env]]", "[[/env]]"

log = logging.getLogger(__name__)
#: Environments already warned about running in the trainer's process (a run builds its loop more than once).
_WARNED_IN_PROCESS: set[str] = set()


@dataclass(frozen=True)
class TurnLimits:
    """``rollout.max_turns``, the per-turn ``max_new_tokens``, the episode's token limit and
    ``max_reply_tokens``."""

    max_turns: int
    max_new_tokens: int
    episode_tokens: int
    max_reply_tokens: int

    @classmethod
    def of(cls, rollout_cfg) -> "TurnLimits":
        r = rollout_cfg
        return cls(r.max_turns, r.max_new_tokens, r.episode_tokens, r.max_reply_tokens)


@dataclass(frozen=True)
class EpisodePrompt:
    """One prompt as an environment sees it: its ids, the messages it was rendered from (None for raw
    text), its assistant prefix, its ``row`` (what ``reset`` receives) and its ``uid``."""

    ids: list[int]
    messages: list[dict] | None
    assistant_prefix: str
    row: dict
    uid: str


def episode_prompts(batch) -> list[EpisodePrompt]:
    """The prompts of a :class:`~arlopti.prompts.batch.PromptBatch`; a row is the record's meta plus
    ``prompt`` (messages, or text), ``ground_truth`` and ``uid`` (:mod:`arlopti.tasks.env.base`)."""
    n = len(batch.prompt_ids)
    messages = batch.messages or [None] * n
    prefixes = batch.assistant_prefixes or [""] * n
    out = []
    for i in range(n):
        row = {**dict(batch.metas[i] or {}), "prompt": messages[i] if messages[i] is not None else
               batch.prompt_texts[i], "ground_truth": batch.ground_truths[i], "uid": batch.uids[i]}
        out.append(EpisodePrompt(list(batch.prompt_ids[i]), messages[i], prefixes[i], row, batch.uids[i]))
    return out


@dataclass
class _Running:
    """An episode being built (see the module docstring for what each count means)."""

    prompt: int
    sample: int
    key: int  # the episode's instance, as the runner knows it (EnvCall.key)
    context: list[int]
    conversation: Conversation
    ids: list[int] = field(default_factory=list)
    trainable: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    parts: list[tuple[bool, list[int]]] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    text: str = ""
    turns: int = 0
    finish: str = ""
    calls: int = 0
    steps: int = 0
    errors: int = 0
    timeouts: int = 0
    reward: float = 0.0
    episode_limit: bool = False
    turn_limit: bool = False
    hung: bool = False  # a call timed out or its process ended: the environment is not called again
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return bool(self.finish)

    def end(self, reason: str) -> None:
        self.finish = reason

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.trainable += [int(sampled)] * len(ids)
        if self.logprobs is not None:
            self.logprobs = None if sampled and logprobs is None else self.logprobs + (
                list(logprobs) if sampled else [0.0] * len(ids))
        self.context += ids
        self.parts.append((not sampled, list(ids)))


class TurnLoop:
    """The turn loop of the module docstring for one environment (``spec``)."""

    def __init__(self, spec: EnvSpec, encoding: ChatEncoding, limits: TurnLimits, calls: EnvCalls,
                 tool_format: str = "hermes", lockstep: bool = False):
        self.spec, self.enc, self.limits, self.calls = spec, encoding, limits, calls
        self.tool_format = tool_format
        self.lockstep = lockstep
        self.tool_names = {t["function"]["name"] for t in spec.tools}
        self._keys = itertools.count()  # episode keys, never reused (a closing episode may still hold one)

    def close(self) -> None:
        """Release the environment's worker processes (a later round starts them again)."""
        self.calls.close()

    # ------------------------------------------------------------------ a round
    def run(self, generate: Callable, prompts: list[EpisodePrompt], group_size: int, sampling: SamplingConfig,
            version: int | None = None) -> list[list[Episode]]:
        """``group_size`` episodes of each prompt (module docstring)."""
        base = sampling.seed if sampling.seed is not None else 0
        keys = [next(self._keys) for _ in range(len(prompts) * group_size)]
        self.calls.open(keys)
        try:
            groups, prompt_ids = self._start(prompts, keys, group_size, base)
            flat = [e for g in groups for e in g]
            for turn in range(self.limits.max_turns):
                pairs = self._generate(generate, turn, flat, prompt_ids, group_size, sampling, base)
                if pairs is None:
                    break
                for e, c, budget in pairs:
                    self._add_turn(e, c, budget)
                self._respond([e for e, _, _ in pairs if not e.done], turn, base)
                self._check_before_next(flat, turn)
            self._rewards(flat, base, prompts)
            episodes = [[self._episode(e, prompt_ids[e.prompt], prompts[e.prompt].ids, version) for e in g]
                        for g in groups]
        finally:
            self.calls.end(keys)
        self.calls.end_round()
        return episodes

    def _generate(self, generate, turn, flat, prompt_ids, group_size, sampling, base):
        """This turn's ``(episode, completion, budget)`` triples, or None when no episode runs on."""
        lim = self.limits
        if turn == 0:
            budget = min(lim.max_new_tokens, lim.episode_tokens)
            outs = generate(prompt_ids, group_size, replace(sampling, max_new_tokens=budget))
            return [(e, c, budget) for e, c in zip(flat, (c for cs in outs for c in cs))]
        live = [e for e in flat if not e.done]
        if not live and not self.lockstep:
            return None
        budgets = [min(lim.max_new_tokens, lim.episode_tokens - len(e.ids)) for e in live]
        s = replace(sampling, seed=turn_seed(base, turn), max_new_tokens=max(budgets, default=1))
        outs = generate([list(e.context) for e in live], 1, s)
        return [(e, cs[0], b) for e, cs, b in zip(live, outs, budgets)]

    def _more(self, turn: int) -> Callable[[str], float]:
        """The most calls of each name one running episode can make after turn ``turn``'s answers: a step
        per later turn (text contract); any number of tool calls while a turn is left, and one
        ``get_reward`` (TRL's). The stop rule reads it to stop early only when the outcome is certain."""
        left = self.limits.max_turns - 1 - turn
        if self.spec.text:
            return lambda name: float(left) if name == "step" else 0.0
        reward = float(self.spec.has_reward)
        return lambda name: reward if name == "get_reward" else (math.inf if left > 0 and name != "reset" else 0.0)

    def _check_before_next(self, flat: list[_Running], turn: int) -> None:
        """The stop rule before the next turn is generated, where already certain (EnvCalls.check)."""
        live = [e for e in flat if not e.done and not e.hung]
        if live and turn + 1 < self.limits.max_turns:
            per = self._more(turn)
            self.calls.check(lambda name: len(live) * per(name))

    @staticmethod
    def _share(owners: list[_Running], results: list[list], wall: float) -> None:
        """Each episode's part of a batch's wall seconds (in proportion to its calls' own seconds), so that
        the episodes' ``env_s`` add up to the wall time spent in the environment."""
        own = [sum(r.seconds for r in res if r is not None) for res in results]
        total = sum(own)
        for e, s in zip(owners, own):
            e.seconds += wall * (s / total if total > 0 else 1 / len(owners))

    # ------------------------------------------------------------------ the start
    def _start(self, prompts: list[EpisodePrompt], keys: list[int], group_size: int,
               base: int) -> tuple[list[list[_Running]], list[list[int]]]:
        """The episodes of every prompt, reset all at once (the first failure stops the run), and each
        prompt's ids (re-rendered with the first message and the tools)."""
        G = group_size
        reset = "reset"
        jobs = [[EnvCall(keys[i * G + j], reset, (dict(p.row),), env_seed(base, reset, i), reset)]
                for i, p in enumerate(prompts) for j in range(G)]
        results, wall = self.calls.run(jobs, fatal=True)
        for n, (r,) in enumerate(results):
            if r is not None and not r.ok:
                self._reset_failed(prompts[n // G], r)
        groups, all_ids = [], []
        for i, p in enumerate(prompts):
            group = [_Running(i, j, keys[i * G + j], [], Conversation(None)) for j in range(G)]
            firsts = [self._first_message(p, results[i * G + j][0].value) for j in range(G)]
            self._same_start(p, firsts)
            ids, messages = self._prompt_ids(p, firsts[0])
            for e in group:
                e.context = list(ids)
                e.conversation = Conversation(None if messages is None else [dict(m) for m in messages],
                                              self.spec.tools or None, p.assistant_prefix)
            groups.append(group)
            all_ids.append(ids)
        flat = [e for g in groups for e in g]
        self._share(flat, results, wall)
        return groups, all_ids

    def _reset_failed(self, p: EpisodePrompt, r: CallResult) -> None:
        if r.build_failed:
            raise EnvError(f"the environment {self.spec.name}: building an instance failed ({r.error})")
        raise EnvError(f"the environment {self.spec.name}: reset on prompt {p.uid} "
                       + (f"did not return within task.env_timeout_s={self.calls.timeout_s} s" if r.timeout else
                          f"failed ({r.error})" if r.gone else f"raised {r.error}"))

    def _first_message(self, p: EpisodePrompt, value) -> str | None:
        if value is not None and not isinstance(value, str):
            raise EnvError(f"the environment {self.spec.name}: reset must return the first message (a str) or "
                           f"None, and returned a {type(value).__name__} on prompt {p.uid}")
        return value

    def _same_start(self, p: EpisodePrompt, firsts: list[str | None]) -> None:
        if len(set(firsts)) > 1:
            other = next(f for f in firsts if f != firsts[0])
            raise EnvError(f"the environment {self.spec.name}: the {len(firsts)} resets of prompt {p.uid} returned "
                           f"different first messages ({firsts[0]!r:.80} vs {other!r:.80}); "
                           "a group's episodes must start from the same state (its advantage baseline compares them): "
                           "derive the state from the row, or draw it from Python's random, which is seeded the same "
                           "for the group")

    def _prompt_ids(self, p: EpisodePrompt, first: str | None) -> tuple[list[int], list[dict] | None]:
        """The prompt's ids, re-rendered with the first message and the tools when there are any, and
        the messages they render (None: a raw-text prompt)."""
        if first is None and not self.spec.tools:
            return list(p.ids), p.messages
        if p.messages is None:
            what = "reset returned a first message" if first is not None else "the environment has tools"
            raise EnvError(f"the environment {self.spec.name}: {what}, but prompt {p.uid} is raw text, not chat "
                           f"messages, so neither can be added to it; render the prompts as chat messages "
                           f"({chat_form_hint()}) or return None from reset")
        messages = [dict(m) for m in p.messages]
        if first is not None:
            if self.spec.text:
                messages.append({"role": "user", "content": first})
            else:  # TRL: the observation is appended to the last message's content
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + first}
        return self.enc.prompt_ids(messages, self.spec.tools, p.assistant_prefix), messages

    # ------------------------------------------------------------------ a turn
    def _add_turn(self, e: _Running, c: Completion, budget: int) -> None:
        ids = list(c.token_ids[:budget])
        cut = len(ids) < len(c.token_ids)
        lps = None if c.logprobs is None else list(c.logprobs[:budget])
        e.add(ids, True, lps)
        e.turn_ids = ids
        decoded = self.enc.tokenizer.decode(ids, skip_special_tokens=True)
        e.conversation.add_turn(decoded)
        e.text = decoded if cut else c.text
        e.turns += 1
        if cut or c.finish_reason == "length":
            e.end("length")

    def _respond(self, live: list[_Running], turn: int, base: int) -> None:
        """The environment's answers to the running episodes' last turns, their calls all in one batch: each
        episode ends, or gets its encoded reply. After a call that timed out or whose process ended the
        environment is not called again: the turn after its error reply is final."""
        jobs, owners = [], []
        for e in live:
            job = None if e.hung else self._calls_of(e, turn, base)
            if job is None:  # hung, or TRL's turn without a tool call (the final answer)
                e.end("stop")
                continue
            jobs.append(job)
            owners.append(e)
        if not jobs:
            return
        results, wall = self.calls.run(jobs, more=self._more(turn))
        self._share(owners, results, wall)
        for e, job, res in zip(owners, jobs, results):
            messages = self._step_reply(e, res[0]) if self.spec.text else self._tool_replies(e, job, res)
            if messages is not None:
                self._append_reply(e, messages, turn)

    def _calls_of(self, e: _Running, turn: int, base: int) -> list[EnvCall] | None:
        """``e``'s calls answering its last turn: the step (text contract), or the turn's tool calls in
        order (TRL's; None when there is none)."""
        if self.spec.text:
            return [EnvCall(e.key, "step", (e.text,), env_seed(base, "step", e.prompt, e.sample, turn), "step")]
        calls = parse_tool_calls(e.text, self.tool_format)
        return [EnvCall(e.key, "tool", (call,), env_seed(base, f"tool{k}", e.prompt, e.sample, turn),
                        self._call_name(call.name)) for k, call in enumerate(calls)] or None

    def _append_reply(self, e: _Running, messages: list[dict], turn: int) -> None:
        """Append the encoded reply, unless the turn was the last allowed or no room is left for another."""
        if turn + 1 >= self.limits.max_turns:
            e.turn_limit = True
            e.end("stop")
            return
        ids, messages, prefix = self._reply_ids(e, messages)
        if len(e.ids) + len(ids) >= self.limits.episode_tokens:  # no room left for the next turn: roll back
            e.episode_limit = True
            e.end("length")
            return
        e.add(ids, False)
        e.conversation.add_reply(messages, prefix)

    @staticmethod
    def _tally(e: _Running, r: CallResult, step: bool = False) -> None:
        """One of ``e``'s environment calls, a text step (``step``) or a tool call; its failure one of its
        errors or timeouts. A step is no tool call: an environment without tools shows none."""
        e.steps += int(step)
        e.calls += int(not step)
        e.errors += int(r.error is not None)
        e.timeouts += int(r.timeout)

    def _call_name(self, name: str | None) -> str:
        """The name a tool call is counted under: the tool's, or ``unknown`` for a name the environment has no tool of."""
        return name if name in self.tool_names else "unknown"

    def _step_reply(self, e: _Running, r: CallResult) -> list[dict] | None:
        """The text contract's step: the reply as a user message, or None when the episode ends."""
        self._tally(e, r, step=True)
        if not r.ok:
            return [{"role": "user", "content": self._failure(e, r)}]
        reply, done, reward = self._step_value(r.value)
        e.reward += reward
        if done or reply is None:
            e.end("stop")
            return None
        return [{"role": "user", "content": reply}]

    def _step_value(self, value) -> tuple[str | None, bool, float]:
        """``(reply, done, reward)`` of what a step returned (:func:`~arlopti.tasks.env.base.check_step_value`: a
        bad shape, a ``done`` that is not a bool or 0/1, or a reward that is not a finite float stops the run)."""
        return check_step_value(self.spec.name, value)

    def _tool_replies(self, e: _Running, job: list[EnvCall], results: list[CallResult | None]) -> list[dict]:
        """TRL's contract: the turn's tool results as tool messages, in order (after a call whose instance is
        gone the later ones were not run)."""
        out = []
        for c, r in zip(job, results):
            if r is None:
                break
            self._tally(e, r)
            name = c.args[0].name
            out.append({"role": "tool", "name": name or "unknown", "content": r.value if r.ok else self._failure(e, r)})
            if r.gone:
                break
        return out

    def _failure(self, e: _Running, r: CallResult) -> str:
        """The error reply of a call that raised, timed out or lost its process (the last two: the environment
        is not called again)."""
        e.hung = e.hung or r.gone
        if r.timeout:
            return f"error: the call did not return within {self.calls.timeout_s:g} s"
        return f"error: {r.error}"

    def _reply_ids(self, e: _Running, messages: list[dict]) -> tuple[list[int], list[dict], str]:
        """``messages`` encoded after ``e``'s last turn, the messages encoded and the text appended after
        them (the environment's ``turn_prefix``); a reply over ``max_reply_tokens`` becomes an error
        reply (the call that made the longest message counts as failed)."""
        limit = self.limits.max_reply_tokens
        as_message = self.enc.has_template and self.enc.ended_turn(e.turn_ids)
        text = "".join(str(m["content"]) for m in messages)
        ids = None
        if len(text) <= CHARS_PER_TOKEN_BOUND * limit:
            ids = self.enc.reply_ids(messages) if as_message else self.enc.text_ids(text)
        if ids is None or len(ids) > limit:
            size = f"{len(ids)} tokens" if ids is not None else f"{len(text)} characters"
            error = f"error: the reply was too long ({size}; the limit is {limit} tokens)"
            longest = max(messages, key=lambda m: len(str(m["content"])))
            what = self._call_name(longest.get("name")) if longest["role"] == "tool" else "step"
            self.calls.count(CallResult(error=error), error, new_call=False, what=what)  # the call that made it failed
            e.errors += 1
            messages = [{**messages[0], "content": error}]
            ids = self.enc.reply_ids(messages) if as_message else self.enc.text_ids(error)
        prefix = self.spec.turn_prefix if as_message else ""
        if prefix:
            ids = ids + self.enc.text_ids(prefix)
        return ids, messages, prefix

    # ------------------------------------------------------------------ the result
    def _rewards(self, flat: list[_Running], base: int, prompts: list[EpisodePrompt]) -> None:
        """TRL's ``get_reward()`` of every episode whose instance is still there, in one batch: added to the
        episode's environment reward. A call that fails scores 0 and counts as a failed call (not as a tool
        call); a value that is not a number, or is NaN or infinite, stops the run naming the environment."""
        todo = [e for e in flat if not e.hung] if self.spec.has_reward and not self.spec.text else []
        if not todo:
            return
        jobs = [[EnvCall(e.key, "get_reward", (), env_seed(base, "reward", e.prompt, e.sample), "get_reward")]
                for e in todo]
        results, wall = self.calls.run(jobs)
        self._share(todo, results, wall)
        for e, (r,) in zip(todo, results):
            if not r.ok:
                e.errors, e.timeouts = e.errors + int(r.error is not None), e.timeouts + int(r.timeout)
                continue
            value = check_reward(self.spec.name, "get_reward", r.value, f" on prompt {prompts[e.prompt].uid}",
                                 optional=False)
            e.reward += value

    def _episode(self, e: _Running, prompt_ids: list[int], original: list[int], version) -> Episode:
        meta = {"turns": e.turns, "tool_calls": e.calls, "env_steps": e.steps, "tool_errors": e.errors,
                "tool_timeouts": e.timeouts,
                "env_tokens": len(e.trainable) - sum(e.trainable), "env_reward": e.reward,
                "episode_limit": int(e.episode_limit), "turn_limit": int(e.turn_limit),
                "env_s": e.seconds, "transcript": self._transcript(e)}
        differs, tokens = retokenization_drift(self.enc, e.conversation, prompt_ids, e.ids)
        meta["retokenize_diff"], meta["retokenize_diff_tokens"] = int(differs), tokens
        rewritten = prompt_ids != original
        if rewritten:
            meta["prompt_text"] = self.enc.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return Episode(token_ids=e.ids, trainable=e.trainable, text=e.text, finish_reason=e.finish or "stop",
                       logprobs=e.logprobs, version=version, meta=meta,
                       prompt_ids=list(prompt_ids) if rewritten else None)

    def _transcript(self, e: _Running) -> str:
        dec = self.enc.tokenizer.decode
        return "".join(f"{ENV_OPEN}{dec(ids, skip_special_tokens=False)}{ENV_CLOSE}" if env else
                       dec(ids, skip_special_tokens=True) for env, ids in e.parts)


def with_env_rewards(results: list[RewardResult], episodes: list[Episode]) -> list[RewardResult]:
    """The task's results with each episode's environment reward added (the component ``env_reward``);
    unchanged when no episode ran an environment."""
    if not any("env_reward" in e.meta for e in episodes):
        return results
    out = []
    for r, e in zip(results, episodes):
        env = float(e.meta.get("env_reward", 0.0))
        out.append(replace(r, reward=r.reward + env, components={**r.components, "env_reward": env}))
    return out


def build_turn_loop(rollout_cfg, env_cfg, tokenizer, lockstep: bool = False) -> TurnLoop | None:
    """The run's turn loop (``task.env`` loaded and probed), or None without an environment; a run
    with ``rollout.max_turns > 1`` and no environment is a :class:`~arlopti.config.ConfigError`."""
    spec = getattr(env_cfg, "env", None)
    if not spec:
        if rollout_cfg.max_turns > 1:
            raise ConfigError(f"rollout.max_turns={rollout_cfg.max_turns}: more than one turn needs an environment "
                              "to reply between them; set task.env=path/to/file.py:Class (docs/multi_turn.md) or "
                              "rollout.max_turns=1")
        if rollout_cfg.max_episode_tokens is not None:
            raise ConfigError(f"rollout.max_episode_tokens={rollout_cfg.max_episode_tokens} limits a multi-turn "
                              "episode, and this run has no environment (task.env): it would be ignored; drop it "
                              "(rollout.max_new_tokens limits a single response)")
        return None
    loaded = load_env(spec)
    runner, fallback = env_runner(loaded, spec)
    calls = EnvCalls(loaded.name, env_cfg.env_timeout_s, env_cfg.max_error_frac, env_cfg.error_window,
                     runner=runner, fallback=fallback)
    return TurnLoop(loaded, ChatEncoding(tokenizer), TurnLimits.of(rollout_cfg), calls, env_cfg.tool_format, lockstep)


def env_runner(loaded: EnvSpec, spec: str):
    """``(runner, fallback)`` for :class:`~arlopti.rollout.env_calls.EnvCalls`: the worker processes when a
    fresh interpreter can import the class by name (``loaded.worker_spec``), with the in-process runner as
    the fallback of a ``callable:`` spec whose import fails there; else the in-process runner, said once."""
    from arlopti.tasks.env.workers import EnvWorkers
    from arlopti.tasks.in_process import is_callable_spec

    def in_process() -> InProcessEnvs:
        return InProcessEnvs(loaded.factory, loaded.text)

    if loaded.worker_spec is not None:
        return (EnvWorkers(loaded.worker_spec, loaded.name, loaded.text),
                in_process if is_callable_spec(spec) else None)
    if loaded.name not in _WARNED_IN_PROCESS:
        _WARNED_IN_PROCESS.add(loaded.name)
        log.warning("environment %s runs in the trainer's process: a fresh Python process cannot import it by name "
                    "(it is defined in __main__, a notebook or a function), so a call past task.env_timeout_s is "
                    "abandoned, not killed, calls run one at a time, and an environment that exits ends the run; "
                    "define the class at the top level of a module file to run it in worker processes "
                    "(docs/multi_turn.md)", loaded.name)
    return in_process(), None


__all__ = ["EpisodePrompt", "TurnLimits", "TurnLoop", "build_turn_loop", "env_runner", "episode_prompts",
           "with_env_rewards"]
