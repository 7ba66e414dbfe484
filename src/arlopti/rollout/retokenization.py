"""What a pipeline that re-tokenizes the conversation would train on, and how much of it differs from ours.

arlopti builds an episode from ids (:mod:`arlopti.rollout.turns`) and never decodes and encodes a turn
again. A framework that keeps the episode as chat messages instead (decode each model turn, append the
environment's messages, apply the chat template to the whole conversation, encode it) trains on other
ids wherever the decoded text does not encode back to what was sampled, or the template renders a
message otherwise than it was encoded: re-tokenization drift (TRL #5144 / #5224; verl's
``tokenization_sanity_check_mode``). :func:`retokenization_drift` measures it per episode, on the CPU,
in one template rendering and one encoding: the metrics ``turns/retokenize_diff_frac`` and
``turns/retokenize_diff_tokens`` (docs/metrics.md).

**Ours**: the episode's prompt ids followed by its ids (the sampled turns and the encoded replies), as
trained.

**Theirs** (:func:`rerendered_ids`): the conversation as messages (:class:`Conversation`): the prompt's
messages (with the environment's first message, as the prompt was rendered), then for each model turn an
assistant message whose content is the turn's ids decoded without special tokens (the text before it
that the model was given as the start of its turn, the prompt's ``assistant_prefix`` or the
environment's ``turn_prefix``, prepended; tool calls stay in the text), and after it the reply messages
exactly as they were encoded (``user`` or ``tool``, error replies included). They are rendered with the
chat template (the environment's tools, no generation prompt) as text and encoded without special
tokens added, as prompts are (:func:`arlopti.prompts.records.render_prompt`). After the last assistant
message the template writes its end-of-turn and whatever follows it (ChatML: ``<|im_end|>\\n``), which
no episode samples: the rendering is cut at its last special token, that token kept when the episode's
last token is special (the model sampled its end-of-turn) and dropped otherwise (the last turn was cut
at its token limit or stopped by a stop string). Without a chat template, or for a raw-text prompt
(no messages), theirs is ours decoded (special tokens kept) and encoded again. A template that raises
on the conversation (one that insists on alternating roles, say) renders nothing: theirs is empty, and
every token of ours differs.

**The counts**: ``differs`` = theirs ≠ ours; ``tokens`` = the length of the span where they differ,
``max(len(ours), len(theirs)) − prefix − suffix`` with ``prefix`` their longest common prefix and
``suffix`` their longest common suffix not overlapping it (0 exactly when they are equal; one changed
piece of text counts the longer side's tokens from its first to its last differing position). No
alignment is computed: O(length).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Conversation:
    """An episode as chat messages (module docstring): ``messages`` (the prompt's, then the turns' and
    replies'; None for a raw-text prompt), the environment's ``tools`` (JSON schemas) and ``prefix``, the
    text the next model turn starts after (added to its assistant message's content)."""

    messages: list[dict] | None
    tools: list[dict] | None = None
    prefix: str = ""

    def add_turn(self, text: str) -> None:
        """A model turn (its decoded text) as an assistant message."""
        if self.messages is not None:
            self.messages.append({"role": "assistant", "content": self.prefix + text})
        self.prefix = ""

    def add_reply(self, messages: list[dict], next_prefix: str = "") -> None:
        """The environment's reply messages, as encoded, and the text the next turn starts after."""
        if self.messages is not None:
            self.messages.extend(dict(m) for m in messages)
        self.prefix = next_prefix


def rerendered_ids(encoding, conversation: Conversation, ours: list[int]) -> list[int]:
    """Theirs (module docstring): ``conversation`` rendered by ``encoding``'s chat template and encoded,
    cut after the template's end of the last turn; ``ours`` decoded and encoded again without a
    template or messages. ``encoding``: a :class:`~arlopti.rollout.chat_encoding.ChatEncoding`."""
    tok = encoding.tokenizer
    if not encoding.has_template or conversation.messages is None:
        return encoding.text_ids(tok.decode(ours, skip_special_tokens=False))
    try:
        text = tok.apply_chat_template(conversation.messages, tools=conversation.tools or None, tokenize=False,
                                       add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template may refuse the conversation (roles that do not alternate, ...)
        return []
    ids = encoding.text_ids(text)
    ends = [i for i, t in enumerate(ids) if t in encoding.special]
    if not ends:
        return ids
    ended = bool(ours) and ours[-1] in encoding.special
    return ids[:ends[-1] + int(ended)]


def drift(ours: list[int], theirs: list[int]) -> tuple[bool, int]:
    """``(differs, tokens)`` of the module docstring."""
    if ours == theirs:
        return False, 0
    shortest = min(len(ours), len(theirs))
    prefix = 0
    while prefix < shortest and ours[prefix] == theirs[prefix]:
        prefix += 1
    suffix = 0
    while suffix < shortest - prefix and ours[-1 - suffix] == theirs[-1 - suffix]:
        suffix += 1
    return True, max(len(ours), len(theirs)) - prefix - suffix


def retokenization_drift(encoding, conversation: Conversation, prompt_ids: list[int],
                         ids: list[int]) -> tuple[bool, int]:
    """``(differs, tokens)`` between ours (``prompt_ids + ids``) and theirs (module docstring)."""
    ours = list(prompt_ids) + list(ids)
    return drift(ours, rerendered_ids(encoding, conversation, ours))


__all__ = ["Conversation", "drift", "rerendered_ids", "retokenization_drift"]
