"""Typed configuration of a run: the one place where every setting, its default, type and help live.

Each dataclass below is registered in Hydra's ConfigStore as ``<group>/schema`` (``algorithm``,
``optim``, ``sizes``, ``model``, ``rollout``; see :func:`register_configs`). The YAML files of
those groups only extend it (``defaults: [schema, _self_]``) and set what differs, so Hydra
rejects an unknown key or a value of the wrong type while composing, naming the key.
``docs/config.md`` is generated from these fields (``python -m arlopti.config_docs``).

A field's ``metadata`` holds its one-line ``help`` and, where they apply, its allowed
``choices`` and its ``range`` (an interval such as ``"[0, 1]"`` or ``"(0, inf)"``).
:func:`validate_run` checks those generically, then the cross-field rules (sizes dividing each
other, …). Every error names the offending key.

Types are checked from the field annotations, in two places, both generic (:func:`check_value`):
:func:`check_overrides` checks each command-line ``key=value`` literal before Hydra composes
(``train.py``), so that ``algorithm.lopti.enabled=no`` is an error rather than OmegaConf's ``False``;
:func:`validate_run` checks the composed values (no ``inf``/``nan`` float unless the range allows it,
tuple lengths, bools and ints). In YAML files, ``yes``/``no``/``on``/``off`` are YAML 1.1 booleans
(the loader turns them into ``true``/``false`` before anything sees them); configs/ uses only
``true``/``false`` (a test checks). ``python train.py`` validates once, in
:func:`arlopti.train.build`, with the Trainer's real world size (:func:`validate_once`).

A new option is a field here (default, help, choices or range) plus the code that reads it.
Its default must reproduce the behaviour from before the option existed: a checkpoint saved
without the key is compared as if it had the default (:func:`saved_run_as_current`).

How the sizes are counted: :class:`SizesConfig`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
import warnings
from dataclasses import InitVar, dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            choices: Any = None, range: str | None = None) -> Any:
    """``field(default=..., metadata={"help": ..., "choices": ..., "range": ...})``.

    ``choices``: a tuple of allowed values, a dict value -> note (shown in messages and docs), or
    a zero-argument callable returning either (for registries filled at import). ``range``: an
    interval, ``[``/``]`` closed, ``(``/``)`` open, ``inf`` unbounded. ``None`` passes both checks
    when the field's type allows it.

    The field's type is checked too (:func:`check_value`): a ``bool`` takes only ``true``/``false``,
    an ``int`` only an integer, a ``float`` only a finite number (``inf`` only where ``range`` is
    closed at an infinite end, e.g. ``"[0, inf]"``; ``nan`` never), a ``tuple[float, float]`` exactly
    two of them.
    """
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if range is not None:
        meta["range"] = range
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _registry(name: str) -> Callable[[], list[str]]:
    def names() -> list[str]:
        from arlopti.algorithms import registry

        return list(getattr(registry, name).names())

    return names


def linear_warmup_multiplier(step: int, warmup: int) -> float:
    """Ours (``optim.lr_schedule=linear_warmup``): ``min(1, (step + 1) / warmup)``, 1 without
    warm-up, so the first scheduler step already runs at a non-zero lr."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def verl_multiplier(step: int, warmup: int) -> float:
    """Official (``optim.lr_schedule=verl``): ``min(1, step / max(1, warmup))``, restating
    ``get_constant_schedule_with_warmup`` in ``verl/utils/torch_functional.py`` of
    zhyang2226/AR-Lopti. With ``warmup = 0`` the multiplier at step 0 is 0: the first update runs
    at lr 0 (Adam's moments and step count still advance)."""
    return min(1.0, step / max(1, warmup))


#: ``optim.lr_schedule`` -> the LR multiplier at scheduler step ``s`` given ``warmup`` steps.
LR_SCHEDULES = {"linear_warmup": linear_warmup_multiplier, "verl": verl_multiplier}

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class LoptiConfig:
    """Low-Probability Token Isolation: update on tokens with p_old < eta first, then the rest."""

    enabled: bool = setting(False, "two update phases per rollout batch (low-probability tokens, then the rest)")
    eta: float = setting(0.5, "split threshold on p_old, strict '<' (the paper: 0.5)", range="(0, 1)")
    granularity: str = setting(
        "batch", "order of the phases over the mini-batches",
        choices={"batch": "official: [low mb1..mbK, high mb1..mbK]", "minibatch": "low then high per mini-batch"})
    reverse: bool = setting(False, "high-probability phase first (the paper's ablation)")
    normalize: str = setting(
        "all", "what a phase's token-mean divides by",
        choices={"all": "official: all valid tokens", "phase": "the phase's own tokens"})
    empty_phase: str = setting(
        "skip", "a phase with no token on any rank",
        choices={"skip": "ours: no optimizer or scheduler step",
                 "step": "official: an optimizer step on zero gradients (weight decay, Adam moments act)"})


@dataclass
class DapoConfig:
    """DAPO's data-side pieces (Yu et al. 2025, arXiv 2503.14476, §3.2-3.4), each off by default.
    `experiment=kk_dapo` turns them on with DAPO's published settings."""

    dynamic_sampling: bool = setting(
        False, "drop groups whose rewards are all equal; sample more prompts until sizes.prompts_per_step groups "
               "carry signal (DAPO eq. 11)")
    max_gen_batches: int = setting(
        3, "dynamic sampling: generation rounds per rollout step at most; then train on what there is",
        range="[1, inf)")
    overlong_buffer: int = setting(
        0, "overlong reward shaping: a linear penalty over the last N tokens before rollout.max_new_tokens; 0 = off "
           "(DAPO eq. 13)", range="[0, inf)")
    overlong_penalty: float = setting(1.0, "overlong shaping: the penalty at the maximum length (DAPO: 1)",
                                      range="[0, inf)")
    mask_truncated: bool = setting(
        False, "truncation masking: responses cut at rollout.max_new_tokens drop out of the loss (DAPO §3.4)")


@dataclass
class RolloutCorrectionConfig:
    """Correction of the rollout/trainer mismatch: the engine sampled with pi_engine, the trainer's
    logp_old is pi_trainer (arlopti.algorithms.mismatch). Needs the engine's log-probs
    (rollout.return_logprobs=true)."""

    mode: str = setting(
        "none", "how the engine/trainer ratio w = pi_trainer / pi_engine enters the policy loss",
        choices={"none": "no correction (metrics only)",
                 "tis": "token-level truncated IS: each token's loss times min(w_t, cap)",
                 "mis": "token masking (IcePop): tokens with w_t outside [mis_low, mis_high] leave the loss",
                 "seq_tis": "sequence-level truncated IS: every token of a response times min(prod_t w_t, cap)"})
    cap: float = setting(2.0, "TIS / sequence-level TIS: the truncation C of the weight", range="(0, inf)")
    mis_low: float = setting(0.5, "MIS: lowest kept ratio", range="[0, inf)")
    mis_high: float = setting(2.0, "MIS: highest kept ratio", range="(0, inf)")


@dataclass
class TokenMethodConfig:
    """A token-level method on top of the estimator, AR and Lopti (arlopti.algorithms.token_methods;
    docs/algorithms.md lists each rule, its source and what composes). `experiment=kk_<method>` sets one."""

    name: str = setting(
        "none", "the method (none; clip_cov / kl_cov: arXiv 2505.22617; top_entropy: 2506.01939; archer: "
                "2507.15778; tr_grpo: 2511.00066; reverse: AR's mirror, our ablation)",
        choices=_registry("TOKEN_METHODS"))
    cov_ratio: float = setting(2e-4, "clip_cov / kl_cov: share of the tokens selected, k = max(1, floor(r * N)) "
                                     "(verl: 2e-4)", range="(0, 1]")
    clip_cov_lb: float = setting(1.0, "clip_cov: candidates have covariance above this (verl: 1)")
    clip_cov_ub: float = setting(5.0, "clip_cov: candidates have covariance below this (verl: 5)")
    kl_cov_coef: float = setting(1.0, "kl_cov: coefficient of |logp - logp_old| on the selected tokens (verl: 1)",
                                 range="[0, inf)")
    entropy_top: float = setting(0.2, "top_entropy: rho, the share of highest-entropy tokens that keep a gradient "
                                      "(the paper: 0.2)", range="(0, 1]")
    archer_quantile: float = setting(0.8, "archer: per-response entropy quantile above which a token is "
                                          "high-entropy (Archer: 0.8)", range="(0, 1)")
    archer_clip_low_entropy: float = setting(0.2, "archer: PPO clip (both sides) of low-entropy tokens (Archer: 0.2)",
                                             range="[0, 1]")
    archer_clip_high_entropy: float = setting(0.5, "archer: PPO clip (both sides) of high-entropy tokens "
                                                   "(Archer's scripts: 0.5)", range="[0, 1]")
    archer_high_entropy_kl: float = setting(0.0, "archer: KL weight of high-entropy tokens, relative to kl_coef "
                                                 "(Archer's scripts: 0)", range="[0, inf)")
    tr_alpha: float = setting(4.0, "tr_grpo: alpha of w = clip(alpha * (sigmoid(p / tau) - mu), min, max) (ours)",
                              range="(0, inf)")
    tr_tau: float = setting(1.0, "tr_grpo: tau (ours)", range="(0, inf)")
    tr_mu: float = setting(0.5, "tr_grpo: mu (ours)", range="[0, 1]")
    tr_min: float = setting(0.0, "tr_grpo: lowest weight (ours)", range="[0, inf)")
    tr_max: float = setting(1.0, "tr_grpo: highest weight (ours)", range="(0, inf)")
    reverse_alpha: float = setting(0.3, "reverse: alpha of A <- (alpha * (1 - p_old) + 1 - alpha) * A",
                                   range="[0, 1]")


@dataclass
class AlgorithmConfig:
    """The RL objective: GRPO, plus Advantage Reweighting (`ar_alpha > 0`) and Lopti
    (`lopti.enabled`). The YAML files `algorithm=grpo|ar|lopti|ar_lopti` set those two;
    `AlgorithmConfig.label` names the combination (for run names and logs)."""

    advantage: str = setting("grpo", "advantage estimator (drgrpo: no std normalisation; rloo: leave-one-out; "
                             "reinforce_pp: whitened return; reinforce_pp_baseline: group mean out, then whitened)",
                             choices=_registry("ADVANTAGE_ESTIMATORS"))
    adv_eps: float = setting(1e-6, "added to the group std of the advantage", range="[0, inf)")
    gamma: float = setting(1.0, "REINFORCE++: discount of the token return (1: the outcome on every token)",
                           range="[0, 1]")
    policy_loss: str = setting("ppo_clip", "the policy loss (ppo_clip: clip-higher + dual-clip; gspo; cispo)",
                               choices=_registry("POLICY_LOSSES"))
    kl_in: str = setting(
        "loss", "where beta (kl_coef) acts",
        choices={"loss": "official: beta * KL(pi || pi_ref) added to the loss",
                 "reward": "folded into the token reward: r_t - beta * kl_estimator(logp_old, logp_ref) (verl's "
                           "apply_kl_penalty)"})
    dapo: DapoConfig = setting(help="DAPO's dynamic sampling, overlong shaping and truncation masking",
                               factory=DapoConfig)
    rollout_correction: RolloutCorrectionConfig = setting(
        help="rollout/trainer mismatch correction", factory=RolloutCorrectionConfig)
    ar_alpha: float = setting(0.0, "Advantage Reweighting alpha: A <- (alpha * p_old + 1 - alpha) * A; 0 = off",
                              range="[0, 1]")
    lopti: LoptiConfig = setting(help="Low-Probability Token Isolation", factory=LoptiConfig)
    token_method: TokenMethodConfig = setting(help="a token-level method (Clip-Cov, KL-Cov, top-entropy, Archer, "
                                                   "TR-GRPO, reverse weighting)", factory=TokenMethodConfig)
    clip_low: float = setting(0.2, "PPO clip below: ratio >= 1 - clip_low (1: no lower bound)", range="[0, 1]")
    clip_high: float = setting(0.24, "PPO clip above: ratio <= 1 + clip_high", range="[0, inf)")
    dual_clip: float | None = setting(10.0, "cap on the loss of negative-advantage tokens: -A * c; null disables",
                                      range="(1, inf)")
    loss_agg: str = setting("token-mean", "how token losses are aggregated", choices=_registry("LOSS_AGGREGATIONS"))
    token_mean_scope: str = setting(
        "minibatch", "what token-mean normalises over",
        choices={"minibatch": "ours: the mini-batch's valid tokens over all ranks (exact, split-independent)",
                 "microbatch": "official: each micro-batch's own token-mean / number of micro-batches"})
    kl_coef: float = setting(0.001, "beta of the KL loss to the reference model; 0 loads no reference model",
                             range="[0, inf)")
    kl_estimator: str = setting("low_var_kl", "KL estimator of the KL loss", choices=_registry("KL_ESTIMATORS"))
    entropy_coef: float = setting(0.0, "entropy bonus coefficient (entropy is always logged)")
    ppo_epochs: int = setting(1, "passes over each rollout batch", range="[1, inf)")
    max_consecutive_skips: int = setting(5, "abort after this many non-finite optimizer steps in a row",
                                         range="[1, inf)")
    #: Removed (not a field, not in YAML): accepted from old Python callers only, and only when it
    #: agrees with ``ar_alpha`` / ``lopti.enabled``; see :data:`RETIRED_KEYS`.
    name: InitVar[str | None] = None

    def __post_init__(self, name: str | None) -> None:
        if name is None:
            return
        if name != self.label:
            raise ConfigError(f"algorithm.name={name!r} disagrees with algorithm.ar_alpha={self.ar_alpha} and "
                              f"algorithm.lopti.enabled={self.lopti.enabled} (that is {self.label!r}). "
                              + RETIRED_KEYS["algorithm.name"])
        warnings.warn("AlgorithmConfig(name=...) is ignored: " + RETIRED_KEYS["algorithm.name"], DeprecationWarning,
                      stacklevel=3)

    @property
    def label(self) -> str:
        """``grpo``, ``ar``, ``lopti`` or ``ar_lopti``, from ``ar_alpha`` and ``lopti.enabled``
        (for run names and logs; nothing reads it to decide what runs)."""
        parts = (["ar"] if self.ar_alpha > 0 else []) + (["lopti"] if self.lopti.enabled else [])
        return "_".join(parts) or "grpo"


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: str = setting("adamw", "optimizer", choices=("adamw", "sgd"))
    lr: float = setting(1e-6, "learning rate", range="(0, inf)")
    weight_decay: float = setting(0.01, "decoupled weight decay (AdamW) / L2 (SGD)", range="[0, inf)")
    betas: tuple[float, float] = setting((0.9, 0.999), "AdamW betas")
    eps: float = setting(1e-8, "AdamW epsilon", range="(0, inf)")
    momentum: float = setting(0.0, "SGD momentum (sgd only)", range="[0, inf)")
    warmup_steps: int = setting(0, "scheduler steps of linear warm-up, then constant", range="[0, inf)")
    lr_schedule: str = setting(
        "linear_warmup", "LR multiplier at scheduler step s",
        choices={"linear_warmup": "ours: min(1, (s+1)/warmup), 1 without warm-up, so step 0 runs at lr",
                 "verl": "official: min(1, s/max(1, warmup)), so the first step runs at lr 0"})
    scheduler_interval: str = setting(
        "optimizer_step", "when the LR scheduler steps",
        choices={"optimizer_step": "ours: after every optimizer step",
                 "phase": "official: once per phase pass over the mini-batches (twice per step under Lopti)"})
    grad_clip: float | None = setting(1.0, "max global gradient norm; null disables", range="(0, inf)")


@dataclass
class SizesConfig:
    """Batch sizes, one name per concept everywhere:

    * `prompts_per_step` P: prompts per rollout step, over all ranks;
    * `group_size` G: responses sampled per prompt (a GRPO group);
    * `mini_batch_size`: responses per optimizer step, over all ranks;
    * `micro_batch_size`: responses per forward/backward **on one device** (gradient
      accumulation); `micro_batch_tokens` replaces it with a token budget when set;
    * `logprob_micro_batch_size`: responses per no-grad forward (old / reference log-probs).

    So one rollout step makes P·G responses and P·G / mini_batch_size optimizer steps per phase
    (GRPO: one phase; Lopti: two).
    """

    prompts_per_step: int = setting(8, "P: prompts per rollout step, over all ranks")
    group_size: int = setting(4, "G: responses sampled per prompt (a GRPO group)")
    mini_batch_size: int = setting(32, "responses per optimizer step, over all ranks")
    micro_batch_size: int = setting(8, "responses per forward/backward on one device (gradient accumulation)")
    micro_batch_tokens: int | None = setting(
        None, "padded-token budget per micro-batch; replaces micro_batch_size when set")
    logprob_micro_batch_size: int = setting(16, "responses per no-grad forward (old / reference log-probs)",
                                            range="[1, inf)")


@dataclass
class TinyModelConfig:
    """The random test model of `model.name_or_path=tiny` (`arlopti.models.TinySpec` is this
    class): `arlopti.models.build_tiny_model` builds it from these fields."""

    arch: str = setting("qwen2", "architecture (model.name_or_path=tiny-llama forces llama)",
                        choices=("qwen2", "llama"))
    hidden_size: int = setting(64, "hidden size (head_dim = hidden_size / num_heads)", range="[1, inf)")
    num_layers: int = setting(2, "decoder layers", range="[1, inf)")
    num_heads: int = setting(4, "attention heads (vLLM-CPU needs head_dim >= 32: see model=tiny_vllm)",
                             range="[1, inf)")
    num_kv_heads: int = setting(2, "key/value heads (grouped-query attention)", range="[1, inf)")
    intermediate_size: int = setting(128, "MLP width", range="[1, inf)")
    tie_word_embeddings: bool = setting(True, "LM head shares the embedding matrix")
    max_position_embeddings: int = setting(8192, "longest sequence (rotary table)", range="[1, inf)")
    seed: int = setting(0, "initialisation seed (the caller's RNG is left untouched)")
    vocab_size: int = setting(512, "BPE vocabulary of the in-process tokenizer (the model takes the tokenizer's)",
                              range="[1, inf)")


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (peft; arlopti/learner/lora.py, docs/lora.md). Off while ``r`` is 0."""

    r: int | None = setting(0, "LoRA rank; 0 or null = full-parameter training (off)", range="[0, inf)")
    alpha: float | None = setting(None, "LoRA alpha (scale alpha / r); null = 2 x r", range="(0, inf)")
    dropout: float = setting(0.0, "dropout on the LoRA input (> 0 makes the training forward stochastic)",
                             range="[0, 1)")
    target_modules: list[str] = setting(
        help="module names to adapt (leaf names such as q_proj, or regex-free full suffixes); "
             "'all-linear' = every decoder linear layer (q,k,v,o,gate,up,down_proj for Qwen2/Llama)",
        factory=lambda: ["all-linear"])
    modules_to_save: list[str] = setting(
        help="modules trained in full next to the adapters, matched by name suffix as peft does (e.g. norm: every "
             "*norm layer); not the LM head", factory=list)


@dataclass
class ModelConfig:
    """The policy, and the frozen reference model built from the same config."""

    name_or_path: str = setting(
        "tiny", "tiny | tiny-llama | smollm2-135m-instruct | a save_pretrained folder | a hub id")
    dtype: str = setting("float32", "dtype of the master weights", choices=_DTYPES)
    logprob_impl: str = setting("fused", "log-prob computation",
                                choices={"fused": "chunked, never materialises [N, V] logits",
                                         "naive": "full fp32 logits"})
    gradient_checkpointing: bool = setting(False, "recompute activations in the backward (saves memory)")
    ref_dtype: str | None = setting(None, "dtype of the frozen reference model; null = model.dtype",
                                    choices=_DTYPES)
    tiny: TinyModelConfig = setting(help="the random test model (name_or_path=tiny only)", factory=TinyModelConfig)
    decoder_layer_class: str | None = setting(
        None, "FSDP2: the decoder-layer class to shard; null = infer from the model (learner.sharding)")
    lora: LoraConfig = setting(help="LoRA adapters (off by default; model.lora.r=16 turns them on)",
                               factory=LoraConfig)


@dataclass
class RolloutConfig:
    """Sampling of the training rollouts (and of eval.py)."""

    backend: str = setting("hf", "generation engine",
                           choices={"hf": "Hugging Face generate on the live policy",
                                    "vllm": "a colocated vLLM engine, re-synced from the policy"})
    temperature: float = setting(0.7, "sampling temperature; also divides the logits of every training log-prob")
    top_p: float = setting(1.0, "nucleus sampling", range="(0, 1]")
    top_k: int = setting(-1, "top-k sampling; -1 = off")
    max_new_tokens: int = setting(256, "response length limit", range="[1, inf)")
    stop: list[str] = setting(help="extra stop strings", factory=list)
    seed: int = setting(0, "sampling seed (the YAML sets ${seed})")
    generation_batch_size: int = setting(64, "responses per HF generate call", range="[1, inf)")
    hf_decoder: str = setting("loop", "HF engine: how it decodes (the same tokens either way)",
                              choices={"loop": "our KV-cached loop over the model's forward, without generate()'s "
                                               "per-step overhead; requests with stop strings use generate()",
                                       "generate": "transformers' generate()"})
    gpu_memory_utilization: float = setting(0.3, "vLLM, CUDA: share of GPU memory for weights + KV cache",
                                            range="(0, 1]")
    enable_sleep: bool = setting(False, "vLLM, CUDA: release memory between rollouts (logged no-op without it)")
    sleep_level: int = setting(1, "vLLM sleep level", choices={1: "offload the weights to CPU",
                                                                2: "drop them (the next sync reloads)"})
    enforce_eager: bool = setting(True, "vLLM: no torch.compile / CUDA graphs (faster start, slower decode)")
    max_model_len: int | None = setting(
        None, "vLLM context length; null = min(max_position_embeddings, max_new_tokens + 4096)")
    sync_bucket_mb: int = setting(256, "vLLM: weights stream to the engine in buckets of this size; 0 = per tensor",
                                  range="[0, inf)")
    return_logprobs: bool = setting(
        True, "keep the engine's sampling log-probs: the rollout/trainer mismatch metrics (mismatch/*) every step, "
              "and algorithm.rollout_correction needs them (about 0.1% of a SmolLM2 decoding step on the HF engine)")
    dtype: str | None = setting(None, "vLLM engine dtype; null = the policy's", choices=_DTYPES)
    lora_sync: str = setting("merged", "vLLM with model.lora: how the adapters reach the engine",
                             choices={"merged": "send W + (alpha/r) B A for adapted layers (the trainer's weights "
                                                "untouched) with the rest of the weights",
                                      "adapter": "the engine serves LoRA; only the adapter is sent, as a new "
                                                 "versioned LoRA request"})


@dataclass
class RunConfig:
    """Everything the learner reads; each field is a Hydra group with a registered schema
    (`<group>/schema`)."""

    algorithm: AlgorithmConfig = setting(help="the RL objective", factory=AlgorithmConfig)
    optim: OptimConfig = setting(help="optimizer and LR schedule", factory=OptimConfig)
    sizes: SizesConfig = setting(help="batch sizes", factory=SizesConfig)
    model: ModelConfig = setting(help="the policy and reference model", factory=ModelConfig)
    rollout: RolloutConfig = setting(help="rollout sampling", factory=RolloutConfig)


#: Keys that existed once: a config setting one is refused with this explanation; a checkpoint
#: saving one is compared without it (:func:`saved_run_as_current`).
RETIRED_KEYS = {
    "algorithm.name": "algorithm.name was removed: what runs follows from algorithm.ar_alpha (> 0: AR) and "
                      "algorithm.lopti.enabled (Lopti); choose with algorithm=grpo|ar|lopti|ar_lopti. "
                      "AlgorithmConfig.label names the combination.",
}


# --------------------------------------------------------------------------------------------
# Hydra
# --------------------------------------------------------------------------------------------

def schemas() -> dict[str, type]:
    """Hydra group -> its dataclass (the fields of :class:`RunConfig`)."""
    return {f.name: type(_default(f)) for f in dataclasses.fields(RunConfig)}


def register_configs() -> None:
    """Store each group's dataclass as ``<group>/schema`` in Hydra's ConfigStore (idempotent).

    Runs when this module is imported; ``train.py`` / ``eval.py`` import it before composing."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, cls in schemas().items():
        cs.store(group=group, name="schema", node=cls)


# --------------------------------------------------------------------------------------------
# Building and checking
# --------------------------------------------------------------------------------------------

def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def from_dict(cls, data: Mapping[str, Any] | None, where: str):
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses.

    Unknown keys raise :class:`ConfigError` naming ``where.key`` and the known keys (a retired
    key: why it went and what replaces it).
    """
    data = dict(data or {})
    known = {f.name: f for f in dataclasses.fields(cls)}
    for name in sorted(set(data) - set(known)):
        if _key(where, name) in RETIRED_KEYS:
            raise ConfigError(RETIRED_KEYS[_key(where, name)])
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where or 'run'}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        default = _default(known[name])
        if dataclasses.is_dataclass(default) and not isinstance(value, type(default)):
            value = from_dict(type(default), value, _key(where, name))
        elif isinstance(default, tuple) and value is not None:
            value = tuple(value)
        elif isinstance(default, list) and value is not None:
            value = list(value)
        kwargs[name] = value
    return cls(**kwargs)


def saved_run_as_current(saved: Mapping[str, Any], cls: type = RunConfig, where: str = "") -> dict:
    """A run config saved by an older version (``hyper_parameters.run``), in today's shape: retired
    keys dropped, keys added since filled with their default (which by convention reproduces the
    old behaviour). Keys this version does not know otherwise stay, so that they show as differences."""
    out = {k: v for k, v in saved.items() if _key(where, k) not in RETIRED_KEYS}
    for f in dataclasses.fields(cls):
        default = _default(f)
        if f.name not in out:
            out[f.name] = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        elif dataclasses.is_dataclass(default) and isinstance(out[f.name], Mapping):
            out[f.name] = saved_run_as_current(out[f.name], type(default), _key(where, f.name))
    return out


def walk_fields(cls: type, where: str = "") -> Iterator[tuple[str, dataclasses.Field, type]]:
    """``(dotted key, field, owning class)`` of every field, depth first (nested dataclasses too)."""
    for f in dataclasses.fields(cls):
        yield _key(where, f.name), f, cls
        default = _default(f)
        if dataclasses.is_dataclass(default):
            yield from walk_fields(type(default), _key(where, f.name))


def field_choices(f: dataclasses.Field) -> dict | None:
    """A field's allowed values as ``{value: note}`` (note "" when none), or None."""
    choices = f.metadata.get("choices")
    if callable(choices):
        choices = choices()
    if choices is None:
        return None
    return dict(choices) if isinstance(choices, Mapping) else {c: "" for c in choices}


def _nullable(f: dataclasses.Field) -> bool:
    return "None" in str(f.type)


def _interval(text: str) -> tuple[float, float, bool, bool]:
    lo, hi = (s.strip() for s in text[1:-1].split(","))
    return float(lo), float(hi), text[0] == "[", text[-1] == "]"


def _alternatives(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]


def _member(value: Any, choices: dict) -> bool:
    try:
        return value in choices
    except TypeError:  # unhashable
        return False


def _check_field(key: str, f: dataclasses.Field, value: Any, hint: Any = None) -> None:
    if hint is not None:
        check_value(key, value, hint, f)
    if value is None and _nullable(f):
        return
    choices = field_choices(f)
    if choices is not None and not _member(value, choices):
        # a note "ours: ..." / "official: ..." shows its tag: 'skip' (ours) or 'step' (official)
        alts = _alternatives([f"{c!r}" + (f" ({note.split(':')[0]})" if ":" in note else "")
                              for c, note in choices.items()])
        raise ConfigError(f"{key}={value!r}: use {alts}" + (", or null" if _nullable(f) else ""))
    if "range" in f.metadata:
        lo, hi, lo_closed, hi_closed = _interval(f.metadata["range"])
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (value >= lo if lo_closed else value > lo) and (value <= hi if hi_closed else value < hi))
        if not ok:
            if math.isinf(hi):
                bound = f"must be {'>=' if lo_closed else '>'} {lo:g}"
            else:
                bound = f"must lie in {f.metadata['range']}"
            raise ConfigError(f"{key}={value!r} {bound}" + (" or null" if _nullable(f) else ""))


def check_fields(cfg: Any, where: str = "") -> None:
    """The type (:func:`check_value`), ``choices`` and ``range`` of every field of dataclass ``cfg``
    (recursively)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, _key(where, f.name))
        else:
            _check_field(_key(where, f.name), f, value, hints.get(f.name))


# --------------------------------------------------------------------------------------------
# Types, from the annotations
# --------------------------------------------------------------------------------------------

def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None`` / ``Optional[T]``, else ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(hint)):
            return args[0], True
    return hint, False


def _inf_allowed(f: dataclasses.Field | None) -> tuple[bool, bool]:
    """Whether ``-inf`` / ``+inf`` are allowed: only by a ``range`` closed at that infinite end."""
    text = f.metadata.get("range") if f is not None else None
    if not text:
        return False, False
    lo, hi, lo_closed, hi_closed = _interval(text)
    return lo_closed and lo == -math.inf, hi_closed and hi == math.inf


def _show(value: Any) -> str:
    """A value as it would be written on the command line / in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # inf, nan, 0.5
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def expected_type(hint: Any, f: dataclasses.Field | None = None) -> str | None:
    """What a field of type ``hint`` accepts, in words (None: a type not checked here, such as str)."""
    base, nullable = _unwrap_optional(hint)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if base is bool:
        text = "a bool (true or false)"
    elif base is int:
        text = "an int"
    elif base is float:
        lo, hi = _inf_allowed(f)
        if lo and hi:
            text = "a float (not nan)"
        else:
            text = "a finite float" + (" or inf" if hi else " or -inf" if lo else "")
    elif origin is tuple and args and args[-1] is not Ellipsis and all(a in (bool, int, float) for a in args):
        names = {a.__name__ for a in args}
        what = f"{names.pop()}s" if len(names) == 1 else "values " + ", ".join(a.__name__ for a in args)
        text = f"a list of exactly {len(args)} {what}"
    else:
        return None
    return text + (", or null" if nullable else "")


def check_value(key: str, value: Any, hint: Any, f: dataclasses.Field | None = None) -> None:
    """Raise :class:`ConfigError` ``"<key>=<value>: expected <type>"`` unless ``value`` fits the field
    type ``hint``: ``bool`` (a real bool, not ``"no"``, ``1``), ``int`` (not a bool, not ``4.5``),
    ``float`` (a number, not a bool; finite unless the field's ``range`` is closed at an infinite end;
    never ``nan``), ``tuple[float, float]`` (exactly that many, each checked), each optionally
    ``| None``. Other types (str, lists of str, dataclasses) are left to Hydra and the choices."""
    base, nullable = _unwrap_optional(hint)
    expected = expected_type(hint, f)
    if expected is None:
        return

    def fail() -> typing.NoReturn:
        raise ConfigError(f"{key}={_show(value)}: expected {expected}")

    if value is None:
        if not nullable:
            fail()
        return
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            fail()
        for i, (item, item_type) in enumerate(zip(value, args)):
            try:
                check_value(f"{key}[{i}]", item, item_type, f)
            except ConfigError:
                fail()
        return
    if isinstance(value, bool) != (base is bool):
        fail()
    if base is int and not isinstance(value, numbers.Integral):
        fail()
    if base is float:
        if not isinstance(value, numbers.Real):
            fail()
        lo, hi = _inf_allowed(f)
        if math.isnan(value) or (value == math.inf and not hi) or (value == -math.inf and not lo):
            fail()


def field_types(cls: type = RunConfig, where: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dotted key, field, type hint)`` of every field of ``cls``, nested dataclasses included
    (their own key first, then their fields)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield _key(where, f.name), f, hints[f.name]
        default = _default(f)
        if dataclasses.is_dataclass(default):
            yield from field_types(type(default), _key(where, f.name))


def _interpolated(value: Any) -> bool:
    """Whether a parsed override value holds an interpolation (``${...}``), in a list too."""
    if isinstance(value, (list, tuple)):
        return any(_interpolated(v) for v in value)
    return isinstance(value, str) and "${" in value


def check_overrides(overrides: Sequence[str], cls: type = RunConfig) -> None:
    """Check Hydra command-line overrides (``key=value``, ``+key=value``, ``++key=value``) against
    the types of the fields they set, before OmegaConf converts them: ``algorithm.lopti.enabled=no``
    would otherwise arrive as ``False``, ``optim.lr=inf`` as ``inf``. Raises :class:`ConfigError`
    naming the key, the value and the expected type (:func:`check_value`).

    Only keys of ``cls`` (the run config's groups) are checked; group choices (``algorithm=lopti``),
    deletions, interpolations (``${...}``) and other keys (``trainer.*``, ``data.*``, ``hydra.*``)
    pass, as do overrides Hydra's parser cannot read (Hydra reports those itself). In a
    ``--multirun`` choice sweep (``key=a,b``) every choice is checked."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    fields_by_key = {key: (f, hint) for key, f, hint in field_types(cls)}
    parser = OverridesParser.create()
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except Exception:  # noqa: BLE001 - a syntax error: Hydra names it itself
            continue
        if override.is_delete() or override.package is not None:
            continue
        entry = fields_by_key.get(override.key_or_group)
        if entry is None:
            continue
        f, hint = entry
        value = override.value()
        if override.is_sweep_override():
            if not isinstance(value, ChoiceSweep):
                continue  # range / interval / glob sweeps: numbers by construction
            values = list(value.list)
        else:
            values = [value]
        for v in values:
            if _interpolated(v):
                continue  # checked after composition (validate_run)
            if expected_type(hint, f) is None:
                continue
            try:
                check_value(override.key_or_group, v, hint, f)
            except ConfigError:
                text = line.split("=", 1)[1] if not override.is_sweep_override() else _show(v)
                raise ConfigError(f"{override.key_or_group}={text}: expected {expected_type(hint, f)} "
                                  "(command-line override)") from None


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def check_rollout_offload(backend: str, cpu_offload: bool) -> None:
    """``rollout.backend=vllm`` with ``trainer.strategy.cpu_offload=true`` is refused (RolloutCallback.setup,
    before the engine starts): the weight sync gathers each FSDP2 shard with ``full_tensor()``, which
    for CPU-offloaded shards would go through the NCCL-only process group; no GPU has run it
    (../shared/notes/gpu_path_review.md R5)."""
    _require(not (backend == "vllm" and cpu_offload),
             "rollout.backend=vllm cannot run with trainer.strategy.cpu_offload=true: the weight sync would gather "
             "CPU-offloaded shards over NCCL (untested, expected to fail). Set trainer.strategy.cpu_offload=false "
             "(7B on 4x80 GB fits without it at the experiments' rollout.gpu_memory_utilization, "
             "benchmarks/memory_plan.py) or use rollout=hf")


def validate_run(cfg: RunConfig, world_size: int = 1) -> None:
    """Field checks (choices, ranges) and cross-field checks; raises :class:`ConfigError` naming
    the key and the numbers."""
    check_fields(cfg)
    s = cfg.sizes
    _require(s.group_size >= 2, f"sizes.group_size={s.group_size} must be >= 2 (GRPO needs a group baseline)")
    _require(s.prompts_per_step >= 1, f"sizes.prompts_per_step={s.prompts_per_step} must be >= 1")
    _require(s.prompts_per_step % world_size == 0,
             f"sizes.prompts_per_step={s.prompts_per_step} is not divisible by the {world_size} data-parallel "
             "ranks (trainer.devices x trainer.num_nodes); each rank needs whole prompts")
    responses = s.prompts_per_step * s.group_size
    _require(s.mini_batch_size >= 1 and responses % s.mini_batch_size == 0,
             f"sizes.mini_batch_size={s.mini_batch_size} must divide the {responses} responses per step "
             f"(sizes.prompts_per_step={s.prompts_per_step} x sizes.group_size={s.group_size})")
    _require(s.mini_batch_size % world_size == 0,
             f"sizes.mini_batch_size={s.mini_batch_size} is not divisible by the {world_size} ranks")
    per_rank = s.mini_batch_size // world_size
    if s.micro_batch_tokens is None:
        _require(s.micro_batch_size >= 1 and per_rank % s.micro_batch_size == 0,
                 f"sizes.micro_batch_size={s.micro_batch_size} (per device) must divide the per-rank mini-batch "
                 f"of {per_rank} responses (sizes.mini_batch_size={s.mini_batch_size} / {world_size} ranks)")
    else:
        _require(isinstance(s.micro_batch_tokens, int) and not isinstance(s.micro_batch_tokens, bool)
                 and s.micro_batch_tokens > 0,
                 f"sizes.micro_batch_tokens={s.micro_batch_tokens!r} must be a positive integer: the padded tokens "
                 "of one micro-batch, rows x (prompt length + longest response), or null for micro_batch_size")
    r = cfg.rollout
    _require(r.temperature > 0, f"rollout.temperature={r.temperature} must be > 0 for training rollouts "
             "(log-probs are computed from logits / T)")
    _validate_lr(cfg.optim)
    _validate_algorithm(cfg.algorithm, r)


_FLOAT32_MAX = 3.4028234663852886e38


def _validate_lr(o: OptimConfig) -> None:
    """The learning rate must be a finite float32, and so must the largest step size the optimizer
    derives from it: AdamW's first step divides lr by its bias correction 1 - beta1 (torch computes
    it in float32, and fails with an overflow error deep inside ``step``)."""
    _require(math.isfinite(o.lr) and abs(o.lr) <= _FLOAT32_MAX,
             f"optim.lr={o.lr!r} is not a finite float32 (largest {_FLOAT32_MAX:.4g}); use a learning rate such "
             "as 1e-6")
    if o.name == "adamw" and 0 <= o.betas[0] < 1:
        step = o.lr / (1.0 - o.betas[0])
        _require(step <= _FLOAT32_MAX,
                 f"optim.lr={o.lr!r} is too large: AdamW's first step size lr / (1 - optim.betas[0]) = {step:.4g} "
                 f"is not a finite float32 (largest {_FLOAT32_MAX:.4g}); use a learning rate such as 1e-6")


#: Policy losses that take no dual-clip, and the loss aggregation a loss requires (if any).
_NO_DUAL_CLIP = ("gspo", "cispo")
_REQUIRED_AGG = {"gspo": "seq-mean-token-mean"}


def _validate_algorithm(a: AlgorithmConfig, r: RolloutConfig) -> None:
    """Combinations of algorithm pieces that cannot apply together, each named with its fix."""
    fix = f" (algorithm={a.policy_loss} sets it)"
    if a.policy_loss in _NO_DUAL_CLIP:
        _require(a.dual_clip is None, f"algorithm.dual_clip={a.dual_clip}: algorithm.policy_loss={a.policy_loss} has "
                 "no dual-clip; set algorithm.dual_clip=null" + fix)
    need = _REQUIRED_AGG.get(a.policy_loss)
    if need is not None:
        _require(a.loss_agg == need, f"algorithm.loss_agg={a.loss_agg} cannot apply to algorithm.policy_loss="
                 f"{a.policy_loss}: its sequence-level ratio is one value per response, so responses must weigh "
                 f"equally; set algorithm.loss_agg={need}" + fix)
    rc = a.rollout_correction
    if rc.mode != "none":
        _require(r.return_logprobs, f"algorithm.rollout_correction.mode={rc.mode} needs the engine's log-probs: "
                 "set rollout.return_logprobs=true")
    if rc.mode == "mis":
        _require(rc.mis_low < rc.mis_high, f"algorithm.rollout_correction.mis_low={rc.mis_low} must be below "
                 f"mis_high={rc.mis_high}")
    _validate_token_method(a)
    d = a.dapo
    _require(d.overlong_buffer < r.max_new_tokens,
             f"algorithm.dapo.overlong_buffer={d.overlong_buffer} must be below rollout.max_new_tokens="
             f"{r.max_new_tokens} (the penalty ramps over the last overlong_buffer tokens)")


def _validate_token_method(a: AlgorithmConfig) -> None:
    """Token methods that cannot compose with the rest (arlopti.algorithms.token_methods' docstring)."""
    tm = a.token_method
    key = f"algorithm.token_method.name={tm.name}"
    if tm.name == "top_entropy":
        _require(not a.lopti.enabled, f"{key} cannot combine with algorithm.lopti.enabled=true: both decide which "
                 "tokens learn, and the top-entropy tokens are mostly low-probability ones, so Lopti's high phase "
                 "would be left almost without gradient; set algorithm.lopti.enabled=false (or pick another method)")
    if tm.name == "reverse":
        _require(a.ar_alpha == 0, f"{key} cannot combine with algorithm.ar_alpha={a.ar_alpha}: reverse weighting is "
                 "AR's mirror image and the two weights cancel; set algorithm.ar_alpha=0")
    if tm.name == "clip_cov":
        _require(a.policy_loss == "ppo_clip", f"{key} needs algorithm.policy_loss=ppo_clip (its candidates exclude "
                 f"the tokens PPO already clipped), not {a.policy_loss}")
        _require(tm.clip_cov_lb < tm.clip_cov_ub, f"algorithm.token_method.clip_cov_lb={tm.clip_cov_lb} must be "
                 f"below clip_cov_ub={tm.clip_cov_ub}")
    if tm.name == "archer":
        _require(a.policy_loss != "gspo", f"{key} cannot apply to algorithm.policy_loss=gspo: one sequence ratio "
                 "per response cannot take per-token clip bounds; use ppo_clip or cispo")
    if tm.name == "tr_grpo":
        _require(tm.tr_min <= tm.tr_max, f"algorithm.token_method.tr_min={tm.tr_min} must not exceed "
                 f"tr_max={tm.tr_max}")


def validate_once(cfg: RunConfig, world_size: int | None = None) -> None:
    """:func:`validate_run`, unless this config, with the same values, passed it already.

    ``world_size=None`` (GRPOModule.__init__, before it knows the world size): any earlier pass
    will do, else it validates for 1 rank. An int (GRPOModule.setup, train.build): an earlier pass
    for that many ranks will do. ``train.build`` validates with the Trainer's real world size before
    it builds the module, so a ``python train.py`` start validates once; a module built directly
    (tests) validates in ``__init__`` and again in ``setup`` only if its world size is not 1.
    """
    stamp = repr(cfg)  # every field's value; changes when the config is edited after a pass
    done = getattr(cfg, "_validated", None)
    if done is not None and done[1] == stamp and world_size in (None, done[0]):
        return
    n = 1 if world_size is None else int(world_size)
    validate_run(cfg, n)
    cfg._validated = (n, stamp)


register_configs()
