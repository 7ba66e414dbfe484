"""``task.reward_model``: a learned reward, a sequence-classification model that gives one score per sequence.

What the peers do, restated: TRL's ``GRPOTrainer`` takes such a model in ``reward_funcs``
(``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``): it joins each prompt and completion, renders them
with the *reward model's own* tokenizer (its chat template for chat prompts, plain concatenation for text),
tokenizes with right padding and no added special tokens, and reads ``logits[:, 0]`` under
``torch.inference_mode``. verl's reward loop and OpenRLHF (``--reward_pretrain`` / a remote URL) score
with the same kind of model. Here, for response ``i`` of prompt ``p_i``::

    r_i = RM(tokenize_RM(render(p_i, y_i)))[0]        (the head's one logit at the sequence's last token)

* ``render`` (:func:`render`): chat messages + ``{"role": "assistant", "content": y_i}`` through the reward
  model's chat template when its tokenizer has one (their contents joined by blank lines when it has none);
  a raw-text prompt (``data.chat_template=false``) is ``p_i + y_i``. The policy's tokenizer plays no part.
  The prompt is the record's (``meta["prompt"]``, :func:`arlopti.tasks.base.with_prompt`); ``y_i`` is the
  decoded response (``data.assistant_prefix`` is part of a raw-text prompt, not of a chat prompt's reply).
* the forward (:func:`forward_scores`): batches of ``task.reward_model_batch_size`` sequences (sorted by
  length, right-padded with the model's ``pad_token_id``), ``torch.inference_mode``, the model in eval
  mode; the transformers head pools the rightmost token that is not the pad token, as for an unpadded
  forward of one sequence.
* where (:meth:`RewardModel.place`): ``task.reward_model_device`` (null: the trainer's device, this rank's
  GPU), in ``task.reward_model_dtype`` (null: the run's compute precision, :func:`precision_dtype`).
  ``eval.py`` has no trainer: there null means ``cuda`` when visible, else ``cpu``, and float32.
* loaded once per process and (model, device, dtype) (:func:`load`), at the first scored batch (training and
  validation share it), with the global RNG state put back afterwards, so a resumed run samples as an
  uninterrupted one; its size is logged. It counts in the GPU memory plan (``benchmarks/memory_plan.py
  --reward-model``): resident on every rank, and its forward runs while vLLM still holds its memory.
* start-up (:func:`check`, when the task is built): the config must read (a local folder offline; a hub name
  needs the network or the hub cache), name its architectures, one of them a ``...ForSequenceClassification``,
  and have ``num_labels == 1``; anything else is a one-line :class:`~arlopti.config.ConfigError` naming
  ``task.reward_model``. A config without ``architectures`` is refused: a causal LM's folder that lost them
  reads as a one-label classifier, and would be scored by a freshly initialised head.
* trust: it is what it claims. At load (:func:`load`) transformers reports the weights it had to initialise
  (``output_loading_info``); any missing or mismatched weight (the score head of a causal LM's folder) is a
  one-line ConfigError naming the folder and the weights. No code of the folder or the hub runs and nothing
  prompts: config, tokenizer and model load with ``trust_remote_code=False`` unless
  ``task.reward_model_trust_remote_code`` is true (:data:`TRUST_KEY`), and a folder that needs its own code is
  refused naming that key.
* length (:func:`forward_scores`): a sequence longer than the model's ``max_position_embeddings`` is scored on
  its first ``max_position_embeddings`` tokens (the end of the response unseen), with one warning per scored
  batch naming the limit; never an ``IndexError`` of a position table.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from arlopti.config import ConfigError

log = logging.getLogger(__name__)

KEY = "task.reward_model"
#: The setting that lets the reward model's folder (or hub repository) run its own code; false by default.
TRUST_KEY = "task.reward_model_trust_remote_code"
#: (name_or_path, device, dtype) -> (model, tokenizer): each reward model is loaded once per process
_LOADED: dict[tuple[str, str, torch.dtype], tuple[Any, Any]] = {}


def precision_dtype(precision: str | None) -> torch.dtype:
    """The dtype a run computes in, from Lightning's precision string (or ``<dtype>-mixed`` for FSDP2's own
    mixed precision, :func:`arlopti.tasks.base.trainer_placement`): bf16 for ``bf16-*`` / ``bfloat16-*``,
    fp16 for ``16-*`` / ``fp16-*`` / ``float16-*``, float32 otherwise (``32-true``, ``64-true``, None)."""
    p = str(precision or "").lower()
    if p.startswith(("bf16", "bfloat16")):
        return torch.bfloat16
    if p.startswith(("16", "fp16", "float16")):
        return torch.float16
    return torch.float32


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _remote_code_refusal(name_or_path: str, err: BaseException, trust_remote_code: bool) -> ConfigError | None:
    """The refusal of a folder that asks to run its own code (transformers' ValueError says so), or None."""
    if trust_remote_code or "trust_remote_code" not in str(err):
        return None
    return ConfigError(f"{KEY}={name_or_path}: it needs its own code (auto_map in its config or tokenizer config), "
                       f"which is not run: {TRUST_KEY}=false. Read that code, then set {TRUST_KEY}=true to run it, "
                       "or give a reward model that transformers loads by itself")


def check(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The reward model's config, read now (no weights); a one-line ConfigError naming ``task.reward_model``
    when it does not read, names no architecture or one that is not sequence classification, or gives other
    than one score."""
    from transformers import AutoConfig

    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ConfigError(f"{KEY}={name_or_path!r}: expected a folder or a hub name of a sequence-classification "
                          "reward model")
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - offline, missing folder, not a model: all one message
        refusal = _remote_code_refusal(name_or_path, err, trust_remote_code)
        if refusal is not None:
            raise refusal from None
        raise ConfigError(f"{KEY}={name_or_path}: cannot read its config ({_first_line(err)}); give a folder holding "
                          "config.json, the weights and the tokenizer, or a hub name reachable (or cached) from "
                          "here") from None
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:
        raise ConfigError(f"{KEY}={name_or_path}: its config.json names no architectures, so nothing says the weights "
                          "hold a trained score head (a causal LM's folder without them loads with a random one); "
                          "give a reward model saved with its class, e.g. [\"...ForSequenceClassification\"] as TRL's "
                          "RewardTrainer saves")
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ConfigError(f"{KEY}={name_or_path}: a {archs[0]}, not a sequence-classification model (its score head "
                          "would be random); give a reward model (e.g. ...ForSequenceClassification with "
                          "num_labels=1, as TRL's RewardTrainer saves)")
    if config.num_labels != 1:
        raise ConfigError(f"{KEY}={name_or_path}: its head gives {config.num_labels} scores per sequence "
                          f"(num_labels={config.num_labels}); a reward model gives one (num_labels=1)")
    return config


def render(tokenizer, prompt: str | list[dict], completion: str) -> str:
    """The text the reward model reads for ``prompt`` (chat messages, or raw text) and ``completion``
    (module docstring): the chat template's rendering of the messages plus the completion as the
    assistant's reply, or ``prompt + completion`` for raw text."""
    if isinstance(prompt, str):
        return prompt + completion
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    messages.append({"role": "assistant", "content": completion})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


def _load_weights(name_or_path: str, dtype: torch.dtype, trust_remote_code: bool) -> tuple[Any, Any]:
    """``(model, tokenizer)`` as transformers loads them, refused in one line when the folder needs its own
    code (not trusted) or when transformers had to initialise any weight (the score head of a causal LM's
    folder: it would score at random)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, output_loading_info=True)
    except ValueError as err:
        refusal = _remote_code_refusal(name_or_path, err, trust_remote_code)
        if refusal is not None:
            raise refusal from None
        raise
    untrained = sorted(info.get("missing_keys") or []) + sorted(str(k[0] if isinstance(k, tuple) else k)
                                                                for k in info.get("mismatched_keys") or [])
    if untrained:
        shown = ", ".join(untrained[:4]) + (f" and {len(untrained) - 4} more" if len(untrained) > 4 else "")
        raise ConfigError(f"{KEY}={name_or_path}: its weights have no trained score head: transformers initialised "
                          f"{shown} afresh (missing from the checkpoint or of another shape), so it would score at "
                          "random; give a trained reward model's folder (e.g. what TRL's RewardTrainer saves), not "
                          "a causal LM's")
    return model, tokenizer


def load(name_or_path: str, device: torch.device, dtype: torch.dtype,
         trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(model, tokenizer)``, loaded at the first call for this (path, device, dtype) and kept for the process
    (refused by :func:`_load_weights` when it is not a trained reward model). The tokenizer pads with the
    model's ``pad_token_id`` (set from the tokenizer's pad, else its eos, when the config has none, as TRL
    does); the global RNG state is restored after loading."""
    key = (name_or_path, str(device), dtype)
    if key not in _LOADED:
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            model, tokenizer = _load_weights(name_or_path, dtype, trust_remote_code)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ConfigError(f"{KEY}={name_or_path}: its tokenizer has neither a pad nor an eos token to pad "
                                  "a batch with; set one in its tokenizer_config.json")
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        model.to(device).eval().requires_grad_(False)
        n = sum(p.numel() for p in model.parameters())
        log.info("%s=%s: %.1f M parameters in %s on %s (%.2f GB), scoring with its own tokenizer%s", KEY,
                 name_or_path, n / 1e6, dtype, device, n * torch.finfo(dtype).bits / 8 / 1e9,
                 " and chat template" if getattr(tokenizer, "chat_template", None) else " (no chat template)")
        _LOADED[key] = (model, tokenizer)
    return _LOADED[key]


def _truncated(ids: list[list[int]], model, name: str) -> list[list[int]]:
    """``ids`` cut to the model's ``max_position_embeddings`` (its position table, or the length it was trained
    for), with one warning naming the limit when any sequence was longer."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit < 1:
        return ids
    long = sum(len(x) > limit for x in ids)
    if long:
        log.warning("%s=%s: %d of %d sequences are longer than its max_position_embeddings=%d tokens (up to %d): "
                    "each is scored on its first %d tokens, the rest of the response unseen", KEY, name, long,
                    len(ids), limit, max(len(x) for x in ids), limit)
    return [x[:limit] for x in ids]


def forward_scores(model, tokenizer, texts: Sequence[str], batch_size: int, name: str = "?") -> list[float]:
    """``logits[:, 0]`` of ``model`` for each text, in batches of ``batch_size`` (sorted by length, right-padded
    with ``model.config.pad_token_id``, no added special tokens, cut to the model's positions:
    :func:`_truncated`), under ``torch.inference_mode``; float32 numbers in the order of ``texts``. ``name``
    is the reward model's, for the warning."""
    ids = _truncated(tokenizer(list(texts), add_special_tokens=False)["input_ids"], model, name)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    device = next(model.parameters()).device
    pad = model.config.pad_token_id
    scores: list[float] = [0.0] * len(ids)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            width = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, :len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                mask[row, :len(ids[i])] = 1
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
            for row, i in enumerate(chunk):
                scores[i] = float(logits[row, 0].float())
    return scores


def _device(value: str | None) -> torch.device | None:
    if value is None:
        return None
    try:
        device = torch.device(str(value))
    except (RuntimeError, ValueError):
        raise ConfigError(f"{KEY}_device={value!r}: expected null (the trainer's device), cpu, cuda or "
                          "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{KEY}_device={value}: no CUDA device is visible here; use cpu or null (the trainer's)")
    return device


class RewardModel:
    """One ``task.reward_model``: checked at construction (:func:`check`), loaded at the first :meth:`score`
    (:func:`load`). ``device`` / ``dtype`` are ``task.reward_model_device`` / ``task.reward_model_dtype``
    (null: where :meth:`place` says the run computes); ``trust_remote_code`` is
    ``task.reward_model_trust_remote_code`` (false: no code of the folder or the hub runs)."""

    def __init__(self, name_or_path: str, device: str | None = None, dtype: str | None = None,
                 batch_size: int = 16, trust_remote_code: bool = False):
        from arlopti.utils.dtypes import torch_dtype

        if not isinstance(trust_remote_code, bool):
            raise ConfigError(f"{TRUST_KEY}={trust_remote_code!r}: expected true or false (false: no code of the "
                              "reward model's folder or the hub runs)")
        self.trust_remote_code = trust_remote_code
        self.config = check(name_or_path, trust_remote_code)
        self.name_or_path = str(name_or_path)
        self.device = _device(device)
        try:
            self.dtype = None if dtype is None else torch_dtype(str(dtype), f"{KEY}_dtype")
        except ValueError as err:
            raise ConfigError(f"{err} or null (the run's precision)") from None
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"{KEY}_batch_size={batch_size!r}: expected an int >= 1 (sequences per forward)")
        self.batch_size = batch_size
        self.run_device: torch.device | None = None
        self.run_dtype: torch.dtype | None = None

    def place(self, device, precision: str) -> None:
        """The trainer's device and precision (:meth:`arlopti.tasks.base.Task.place`): the defaults of the
        device and dtype keys."""
        self.run_device, self.run_dtype = torch.device(device), precision_dtype(precision)

    def where(self) -> tuple[torch.device, torch.dtype]:
        """The device and dtype it scores on (the class docstring; unplaced: cuda when visible, float32)."""
        fallback = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return (self.device or self.run_device or fallback), (self.dtype or self.run_dtype or torch.float32)

    def score(self, prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
        """One score per (prompt, completion) (module docstring); a missing prompt is a ValueError."""
        missing = [i for i, p in enumerate(prompts) if not isinstance(p, (str, list))]
        if missing:
            raise ValueError(f"{KEY}: response {missing[0]} has no prompt (meta['prompt'] is "
                             f"{type(prompts[missing[0]]).__name__}); the reward model scores prompt + response, "
                             "and the rollout and validation pass each record's prompt in meta['prompt']")
        model, tokenizer = load(self.name_or_path, *self.where(), trust_remote_code=self.trust_remote_code)
        texts = [render(tokenizer, p, c) for p, c in zip(prompts, completions)]
        return forward_scores(model, tokenizer, texts, self.batch_size, self.name_or_path)


def loaded_models() -> dict[tuple[str, str, torch.dtype], tuple[Any, Any]]:
    """What this process has loaded (for tests and memory accounting)."""
    return dict(_LOADED)


def forget_loaded() -> None:
    """Drop every loaded reward model of this process (a test that wants a fresh load)."""
    _LOADED.clear()
