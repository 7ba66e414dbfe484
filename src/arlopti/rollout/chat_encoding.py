"""Token ids of what an environment adds to an episode, the way the chat template encodes it.

A multi-turn episode is built from ids only (:mod:`arlopti.rollout.turns`): the model's sampled ids,
then the environment's reply encoded here, then the next turn. Nothing already in the episode is
decoded and encoded again, which is what makes re-tokenization drift impossible (TRL #5224 / #5144,
fixed by PR #5242; verl's ``tokenization_sanity_check_mode``).

* :meth:`ChatEncoding.reply_ids` (a reply after a model turn that ended on its end-of-turn token): the
  difference of the chat template applied with and without the reply's messages, after a dummy
  exchange, the next turn's generation prompt included. Restated from TRL's
  ``GRPOTrainer._get_tool_suffix_ids`` (trl/trainer/grpo_trainer.py): the prefix is a dummy user
  message and an assistant message (with a dummy tool call naming the real tool before ``tool``
  messages: some templates take the tool response header from it), rendered without a generation
  prompt, cut after its last special token (the end-of-turn token, which the model sampled itself:
  ``<|im_end|>`` without the ``\\n`` a ChatML template writes after it); the full rendering must start
  with that prefix (a template that is not prefix-preserving is an error) and the rest is the reply.
* :meth:`ChatEncoding.text_ids` (a reply after a turn stopped by a stop string, or any reply when the
  tokenizer has no chat template): the reply as plain text.
* :meth:`ChatEncoding.prompt_ids`: a prompt re-rendered from its messages, with the environment's
  tools and first message, as :func:`arlopti.prompts.records.render_prompt` renders one (the
  template's text, then the assistant prefix, encoded without special tokens added).

What a pipeline that re-rendered the whole conversation would train on instead is measured by
:mod:`arlopti.rollout.retokenization` (the metrics ``turns/retokenize_diff_*``).
"""

from __future__ import annotations

from arlopti.tasks.env.base import EnvError

_DUMMY_USER = {"role": "user", "content": "dummy"}


class ChatEncoding:
    """The encodings of the module docstring for ``tokenizer``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.has_template = getattr(tokenizer, "chat_template", None) is not None
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])

    # ------------------------------------------------------------------ helpers
    def _template_ids(self, messages: list[dict], generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                                 return_dict=False)
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def text_ids(self, text: str) -> list[int]:
        """``text`` encoded as it is (no special token added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def ended_turn(self, turn_ids: list[int]) -> bool:
        """Whether a model turn ended on a special token (its end-of-turn), not on a stop string."""
        return bool(turn_ids) and turn_ids[-1] in self.special

    # ------------------------------------------------------------------ replies
    def reply_ids(self, messages: list[dict]) -> list[int]:
        """The ids of the reply ``messages`` (``user`` or ``tool`` messages) after a finished model turn,
        the next turn's generation prompt included (module docstring)."""
        if not self.has_template:
            return self.text_ids("".join(str(m["content"]) for m in messages))
        assistant = {"role": "assistant", "content": "dummy"}
        if messages and messages[0]["role"] == "tool":
            call = {"type": "function", "function": {"name": messages[0].get("name", "tool"), "arguments": {}}}
            assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
        prefix = self._template_ids([_DUMMY_USER, assistant], generation_prompt=False)
        ends = [i for i, t in enumerate(prefix) if t in self.special]
        if ends:
            prefix = prefix[:ends[-1] + 1]
        full = self._template_ids([_DUMMY_USER, assistant, *messages], generation_prompt=True)
        if full[:len(prefix)] != prefix:
            raise EnvError("the chat template is not prefix-preserving: appending a message changed how the earlier "
                           "ones are rendered, so a reply cannot be encoded without re-encoding the turns before it "
                           "(use a template that renders history unchanged)")
        return full[len(prefix):]

    # ------------------------------------------------------------------ prompts
    def prompt_ids(self, messages: list[dict], tools: list[dict] | None, assistant_prefix: str) -> list[int]:
        """A prompt rendered from ``messages`` with ``tools`` (as the datamodule renders one)."""
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True)
        if tools:
            plain = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            if plain == text:
                raise EnvError("the chat template ignores tools=: the model would never see the environment's tool "
                               "schema. Use a model whose template renders tools (Qwen2.5, Qwen3, Llama 3.1+), or "
                               "the text contract (a step(text) method) with a protocol in the prompt")
        return self.text_ids(text + assistant_prefix)


__all__ = ["ChatEncoding"]
