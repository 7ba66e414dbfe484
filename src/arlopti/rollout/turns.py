"""Multi-turn episodes: the turn loop between the policy's generator and an environment (``task.env``).

:class:`TurnLoop` is what :func:`arlopti.rollout.source.collect_groups` runs when the run has an
environment; every rollout source (HF, colocated vLLM with token-id prompts, the rollout workers with
token ids over their route) hands it its own ``generate`` and nothing else changes. Without an
environment ``collect_groups`` makes its one generation call, as before.

One round (:meth:`TurnLoop.run`), for a step's prompts and ``G`` episodes each:

1. **start**: ``G`` environment instances per prompt, each reset on the prompt's record (the row:
   :func:`episode_prompts`), with Python's ``random`` seeded the same for the ``G`` of a prompt
   (:mod:`arlopti.rollout.env_calls`); their first messages must agree. The prompt is re-rendered
   from its messages when the environment adds a first message or tools
   (:class:`~arlopti.rollout.chat_encoding.ChatEncoding`; :mod:`arlopti.tasks.env.base` says how),
   else its ids are kept as they are;
2. **turn 0** is the single-turn call itself: ``generate(prompts, G, sampling)`` with the round's
   seeds, so a one-turn episode samples exactly the tokens a plain response would;
3. **after each model turn**, per episode: a turn cut at its token limit ends the episode
   (truncated); else the environment answers (the text contract's ``step``; TRL's: the turn's tool
   calls, each run, a turn with none ends the episode). ``done``, no reply, or the last of
   ``rollout.max_turns`` turns ends it; a call that raised or timed out gives an error reply (after a
   timeout the environment is not called again: the next turn is final); else the reply is encoded
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
when the environment re-rendered the prompt, and in ``meta``: ``turns``, ``tool_calls`` (steps of a
text environment count as calls), ``tool_errors``, ``tool_timeouts``, ``env_tokens``, ``env_reward``
(the sum of the steps' rewards, or TRL's ``get_reward()``), ``episode_limit`` (1: rolled back at the
episode limit), ``turn_limit`` (1: a reply was due after the last allowed turn), ``retokenize_diff``
(1: the conversation re-rendered by the chat template and encoded differs from the prompt and the
episode's ids) and ``retokenize_diff_tokens`` (the length of the span where they differ;
:mod:`arlopti.rollout.retokenization`), ``env_s`` (seconds in the
environment) and ``transcript`` (the episode as text, the environment's parts between ``[[env]]`` and
``[[/env]]``). :func:`with_env_rewards` adds ``env_reward`` to the task's reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from arlopti.config import ConfigError
from arlopti.rollout.chat_encoding import ChatEncoding
from arlopti.rollout.engine import Completion, SamplingConfig
from arlopti.rollout.env_calls import CallResult, EnvCalls
from arlopti.rollout.episode import Episode
from arlopti.rollout.retokenization import Conversation, retokenization_drift
from arlopti.rollout.seeds import env_seed, turn_seed
from arlopti.tasks.base import RewardResult
from arlopti.tasks.env.base import EnvError
from arlopti.tasks.env.loading import EnvSpec, load_env
from arlopti.tasks.env.tools import call_tool, parse_tool_calls, tool_methods

#: A reply of more than this many characters per allowed token is refused before it is encoded.
CHARS_PER_TOKEN_BOUND = 8
ENV_OPEN, ENV_CLOSE = "[[env]]", "[[/env]]"


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
    env: object
    context: list[int]
    conversation: Conversation
    tools: dict = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    trainable: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    parts: list[tuple[bool, list[int]]] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    text: str = ""
    turns: int = 0
    finish: str = ""
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    reward: float = 0.0
    episode_limit: bool = False
    turn_limit: bool = False
    hung: bool = False  # a call timed out: its thread may still run, the environment is not called again
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

    # ------------------------------------------------------------------ a round
    def run(self, generate: Callable, prompts: list[EpisodePrompt], group_size: int, sampling: SamplingConfig,
            version: int | None = None) -> list[list[Episode]]:
        """``group_size`` episodes of each prompt (module docstring)."""
        base = sampling.seed if sampling.seed is not None else 0
        groups: list[list[_Running]] = []
        try:
            prompt_ids = []
            for i, p in enumerate(prompts):
                group, ids = self._start(i, p, group_size, base)
                groups.append(group)
                prompt_ids.append(ids)
            flat = [e for g in groups for e in g]
            for turn in range(self.limits.max_turns):
                pairs = self._generate(generate, turn, flat, prompt_ids, group_size, sampling, base)
                if pairs is None:
                    break
                for e, c, budget in pairs:
                    self._add_turn(e, c, budget)
                for e, _, _ in pairs:
                    if not e.done:
                        self._respond(e, turn, base)
            episodes = [[self._episode(e, prompt_ids[e.prompt], prompts[e.prompt].ids, version, base) for e in g]
                        for g in groups]
        finally:
            for e in (e for g in groups for e in g):
                close = getattr(e.env, "close", None)
                if callable(close):
                    self.calls.call(close, seed=0, counted=False)
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

    # ------------------------------------------------------------------ the start
    def _start(self, i: int, p: EpisodePrompt, group_size: int, base: int) -> tuple[list[_Running], list[int]]:
        group, firsts = [], []
        for j in range(group_size):
            try:
                env = self.spec.factory()
            except Exception as err:  # noqa: BLE001 - user code
                raise EnvError(f"the environment {self.spec.name}: building an instance failed "
                               f"({type(err).__name__}: {err})") from None
            tools = {} if self.spec.text else tool_methods(env)
            group.append(_Running(i, j, env, [], Conversation(None), tools=tools))
            reset = (lambda env=env: env.reset(dict(p.row))) if self.spec.text else (lambda env=env: env.reset(**p.row))
            r = self.calls.call(reset, seed=env_seed(base, "reset", i), what="reset")
            group[-1].seconds += r.seconds
            if not r.ok:
                raise EnvError(f"the environment {self.spec.name}: reset on prompt {p.uid} "
                               + (f"raised {r.error}" if r.error else
                                  f"did not return within task.env_timeout_s={self.calls.timeout_s} s"))
            if r.value is not None and not isinstance(r.value, str):
                raise EnvError(f"the environment {self.spec.name}: reset must return the first message (a str) or "
                               f"None, and returned a {type(r.value).__name__} on prompt {p.uid}")
            firsts.append(r.value)
        if len(set(firsts)) > 1:
            other = next(f for f in firsts if f != firsts[0])
            raise EnvError(f"the environment {self.spec.name}: the {group_size} resets of prompt {p.uid} returned "
                           f"different first messages ({firsts[0]!r:.80} vs {other!r:.80}); "
                           "a group's episodes must start from the same state (its advantage baseline compares them): "
                           "derive the state from the row, or draw it from Python's random, which is seeded the same "
                           "for the group")
        ids, messages = self._prompt_ids(p, firsts[0])
        for e in group:
            e.context = list(ids)
            e.conversation = Conversation(None if messages is None else [dict(m) for m in messages],
                                          self.spec.tools or None, p.assistant_prefix)
        return group, ids

    def _prompt_ids(self, p: EpisodePrompt, first: str | None) -> tuple[list[int], list[dict] | None]:
        """The prompt's ids, re-rendered with the first message and the tools when there are any, and
        the messages they render (None: a raw-text prompt)."""
        if first is None and not self.spec.tools:
            return list(p.ids), p.messages
        if p.messages is None:
            what = "reset returned a first message" if first is not None else "the environment has tools"
            raise EnvError(f"the environment {self.spec.name}: {what}, but prompt {p.uid} is raw text, not chat "
                           "messages, so neither can be added to it; render the prompts with the chat template "
                           "(data.template=chat, data.chat_template=true) or return None from reset")
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

    def _respond(self, e: _Running, turn: int, base: int) -> None:
        """The environment's answer to ``e``'s last turn: end the episode, or append the encoded reply. After a
        call that timed out the environment is not called again: the turn after its error reply is final."""
        if e.hung:
            e.end("stop")
            return
        messages = self._step(e, turn, base) if self.spec.text else self._tools(e, turn, base)
        if messages is None:
            return
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

    def _call(self, e: _Running, fn, seed: int, what: str = "step", tool: bool = True) -> CallResult:
        """A counted call of ``e``'s environment named ``what``; ``tool``: also one of the episode's tool
        calls (a step or a tool), its failure one of its tool errors or timeouts."""
        r = self.calls.call(fn, seed=seed, what=what)
        e.seconds += r.seconds
        if tool:
            e.calls += 1
            e.errors += int(r.error is not None)
            e.timeouts += int(r.timeout)
        return r

    @staticmethod
    def _call_name(e: _Running, name: str | None) -> str:
        """The name a tool call is counted under: the tool's, or ``unknown`` for a name ``e`` has no tool of."""
        return name if name in e.tools else "unknown"

    def _step(self, e: _Running, turn: int, base: int) -> list[dict] | None:
        """The text contract's step: the reply as a user message, or None when the episode ends."""
        r = self._call(e, lambda: e.env.step(e.text), env_seed(base, "step", e.prompt, e.sample, turn))
        if not r.ok:
            return [{"role": "user", "content": self._failure(e, r)}]
        reply, done, reward = self._step_value(r.value)
        e.reward += reward
        if done or reply is None:
            e.end("stop")
            return None
        return [{"role": "user", "content": reply}]

    def _step_value(self, value) -> tuple[str | None, bool, float]:
        ok = isinstance(value, (tuple, list)) and len(value) == 3 and (value[0] is None or isinstance(value[0], str))
        reward = value[2] if ok else None
        ok = ok and (reward is None or (isinstance(reward, (int, float)) and not isinstance(reward, bool)))
        if not ok:
            raise EnvError(f"the environment {self.spec.name}: step must return (reply: str | None, done: bool, "
                           f"reward: float | None), and returned {value!r:.120}")
        if reward is not None and not math.isfinite(reward):
            raise EnvError(f"the environment {self.spec.name}: step returned a non-finite reward {reward}")
        return value[0], bool(value[1]), float(reward or 0.0)

    def _tools(self, e: _Running, turn: int, base: int) -> list[dict] | None:
        """TRL's contract: the turn's tool calls run in order, their results as tool messages (None: no
        call, the episode ends; after a call past the timeout the later calls are not run)."""
        calls = parse_tool_calls(e.text, self.tool_format)
        if not calls:
            e.end("stop")
            return None
        out = []
        for k, call in enumerate(calls):
            r = self._call(e, lambda call=call: call_tool(e.tools, call),
                           env_seed(base, f"tool{k}", e.prompt, e.sample, turn), what=self._call_name(e, call.name))
            out.append({"role": "tool", "name": call.name or "unknown",
                        "content": r.value if r.ok else self._failure(e, r)})
            if r.timeout:
                break
        return out

    def _failure(self, e: _Running, r: CallResult) -> str:
        """The error reply of a call that raised or timed out (a timed-out environment is not called again)."""
        if r.timeout:
            e.hung = True
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
            what = self._call_name(e, longest.get("name")) if longest["role"] == "tool" else "step"
            self.calls.count(CallResult(error=error), error, new_call=False, what=what)  # the call that made it failed
            e.errors += 1
            messages = [{**messages[0], "content": error}]
            ids = self.enc.reply_ids(messages) if as_message else self.enc.text_ids(error)
        prefix = self.spec.turn_prefix if as_message else ""
        if prefix:
            ids = ids + self.enc.text_ids(prefix)
        return ids, messages, prefix

    # ------------------------------------------------------------------ the result
    def _episode(self, e: _Running, prompt_ids: list[int], original: list[int], version, base: int) -> Episode:
        if not self.spec.text and not e.hung and callable(getattr(e.env, "get_reward", None)):
            r = self._call(e, e.env.get_reward, env_seed(base, "reward", e.prompt, e.sample), what="get_reward",
                           tool=False)
            if not r.ok:  # scores 0 and counts as a failed call (not as a tool call)
                e.errors, e.timeouts = e.errors + int(r.error is not None), e.timeouts + int(r.timeout)
            value = r.value if r.ok else 0.0
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EnvError(f"the environment {self.spec.name}: get_reward must return a number, and returned a "
                               f"{type(value).__name__}")
            e.reward += float(value) if math.isfinite(value) else 0.0
        meta = {"turns": e.turns, "tool_calls": e.calls, "tool_errors": e.errors, "tool_timeouts": e.timeouts,
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
    calls = EnvCalls(loaded.name, env_cfg.env_timeout_s, env_cfg.max_error_frac, env_cfg.error_window)
    return TurnLoop(loaded, ChatEncoding(tokenizer), TurnLimits.of(rollout_cfg), calls, env_cfg.tool_format, lockstep)


__all__ = ["EpisodePrompt", "TurnLimits", "TurnLoop", "build_turn_loop", "episode_prompts", "with_env_rewards"]
