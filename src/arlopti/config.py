"""Typed configuration of a run, validated at start-up.

Hydra composes YAML; :func:`from_dict` turns each node into one of these dataclasses and
rejects unknown keys, and :func:`validate_run` checks the cross-field rules (sizes dividing
each other, α and η ranges, …). Every error names the offending key.

Sizes are counted like this (one name per concept, everywhere):

* ``sizes.prompts_per_step`` P: prompts per rollout step, over all ranks;
* ``sizes.group_size`` G: responses sampled per prompt (a GRPO group);
* ``sizes.mini_batch_size``: responses per optimizer step, over all ranks;
* ``sizes.micro_batch_size``: responses per forward/backward **on one device** (gradient
  accumulation); ``sizes.micro_batch_tokens`` replaces it with a token budget when set;
* ``sizes.logprob_micro_batch_size``: responses per no-grad forward (old/ref log-probs).

So one rollout step makes P·G responses and P·G / mini_batch_size optimizer steps per phase
(GRPO: one phase; Lopti: two).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


@dataclass
class LoptiConfig:
    enabled: bool = False
    eta: float = 0.5  # split threshold on p_old, strict "<"; must lie in (0, 1)
    granularity: str = "batch"  # batch: [low mb1..mbK, high mb1..mbK] (official) | minibatch
    reverse: bool = False  # high first (the paper's ablation)
    normalize: str = "all"  # all: divide by all valid tokens (official) | phase: by the phase's own
    # A phase with no token on any rank: skip (ours: no optimizer or scheduler step) | step (official:
    # an optimizer step on zero gradients, so weight decay and Adam's moments and step count still act)
    empty_phase: str = "skip"


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    advantage: str = "grpo"  # grpo | drgrpo | rloo
    adv_eps: float = 1e-6
    ar_alpha: float = 0.0  # Advantage Reweighting α in [0, 1]; 0 = off
    lopti: LoptiConfig = field(default_factory=LoptiConfig)
    clip_low: float = 0.2
    clip_high: float = 0.24
    dual_clip: float | None = 10.0
    loss_agg: str = "token-mean"
    # minibatch: normalise by the mini-batch's valid tokens over all ranks (exact, split-independent);
    # microbatch: each micro-batch's own token-mean / number of micro-batches (verl 0.2, the official code)
    token_mean_scope: str = "minibatch"
    kl_coef: float = 0.001  # β; 0 loads no reference model
    kl_estimator: str = "low_var_kl"
    entropy_coef: float = 0.0
    ppo_epochs: int = 1
    max_consecutive_skips: int = 5  # abort after this many non-finite steps in a row


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | sgd
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0  # sgd only
    warmup_steps: int = 0  # scheduler steps of linear warm-up, then constant
    # linear_warmup (ours): multiplier min(1, (s+1)/warmup), 1 without warm-up, so step 0 runs at lr;
    # verl (official): min(1, s/max(1, warmup)), so the very first scheduler step runs at lr 0
    lr_schedule: str = "linear_warmup"
    # optimizer_step (ours): the scheduler steps after every optimizer step; phase (official): once per
    # phase pass over the mini-batches (verl's once per update_actor call), so twice per step under Lopti
    scheduler_interval: str = "optimizer_step"
    grad_clip: float | None = 1.0


@dataclass
class SizesConfig:
    prompts_per_step: int = 8
    group_size: int = 4
    mini_batch_size: int = 32
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    logprob_micro_batch_size: int = 16


@dataclass
class TinyModelConfig:
    arch: str = "qwen2"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    tie_word_embeddings: bool = True
    seed: int = 0
    vocab_size: int = 512


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    dtype: str = "float32"  # master weights
    logprob_impl: str = "fused"  # fused | naive
    gradient_checkpointing: bool = False
    # dtype of the frozen reference model; null = model.dtype. The GPU experiments use bfloat16 (official)
    ref_dtype: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    # FSDP2: the decoder-layer class to shard; null = infer from the model (see learner.sharding)
    decoder_layer_class: str | None = None


@dataclass
class RolloutConfig:
    backend: str = "hf"  # hf | vllm
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    generation_batch_size: int = 64  # responses per HF generate call
    # vLLM only
    gpu_memory_utilization: float = 0.3
    enable_sleep: bool = False
    sleep_level: int = 1
    enforce_eager: bool = True
    max_model_len: int | None = None
    sync_bucket_mb: int = 256
    return_logprobs: bool = False
    dtype: str | None = None  # engine dtype; null = the policy's


@dataclass
class RunConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sizes: SizesConfig = field(default_factory=SizesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


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


def from_dict(cls, data: Mapping[str, Any] | None, where: str):
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses.

    Unknown keys raise :class:`ConfigError` naming ``where.key`` and the known keys.
    """
    data = dict(data or {})
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        f = known[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default) and not isinstance(value, type(default)):
            value = from_dict(type(default), value, f"{where}.{name}")
        elif isinstance(default, tuple) and value is not None:
            value = tuple(value)
        elif isinstance(default, list) and value is not None:
            value = list(value)
        kwargs[name] = value
    return cls(**kwargs)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_run(cfg: RunConfig, world_size: int = 1) -> None:
    """Cross-field checks; raises :class:`ConfigError` naming the key and the numbers."""
    from arlopti.algorithms.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS

    a, s, o = cfg.algorithm, cfg.sizes, cfg.optim
    _require(0.0 <= a.ar_alpha <= 1.0, f"algorithm.ar_alpha={a.ar_alpha} must lie in [0, 1]")
    if a.lopti.enabled:
        _require(0.0 < a.lopti.eta < 1.0, f"algorithm.lopti.eta={a.lopti.eta} must lie in (0, 1)")
    _require(a.lopti.granularity in ("batch", "minibatch"),
             f"algorithm.lopti.granularity={a.lopti.granularity!r}: use 'batch' or 'minibatch'")
    _require(a.lopti.normalize in ("all", "phase"),
             f"algorithm.lopti.normalize={a.lopti.normalize!r}: use 'all' or 'phase'")
    _require(a.lopti.empty_phase in ("skip", "step"),
             f"algorithm.lopti.empty_phase={a.lopti.empty_phase!r}: use 'skip' (ours) or 'step' (official)")
    _require(a.advantage in ADVANTAGE_ESTIMATORS.names(),
             f"algorithm.advantage={a.advantage!r}: choose one of {ADVANTAGE_ESTIMATORS.names()}")
    _require(a.kl_estimator in KL_ESTIMATORS.names(),
             f"algorithm.kl_estimator={a.kl_estimator!r}: choose one of {KL_ESTIMATORS.names()}")
    _require(a.loss_agg in LOSS_AGGREGATIONS.names(),
             f"algorithm.loss_agg={a.loss_agg!r}: choose one of {LOSS_AGGREGATIONS.names()}")
    _require(a.token_mean_scope in ("minibatch", "microbatch"),
             f"algorithm.token_mean_scope={a.token_mean_scope!r}: use 'minibatch' or 'microbatch'")
    _require(0 <= a.clip_low < 1 and a.clip_high >= 0,
             f"algorithm.clip_low={a.clip_low} must lie in [0, 1) and clip_high={a.clip_high} be >= 0")
    _require(a.dual_clip is None or a.dual_clip > 1, f"algorithm.dual_clip={a.dual_clip} must be > 1 or null")
    _require(a.kl_coef >= 0, f"algorithm.kl_coef={a.kl_coef} must be >= 0")
    _require(a.ppo_epochs >= 1, f"algorithm.ppo_epochs={a.ppo_epochs} must be >= 1")
    _require(a.max_consecutive_skips >= 1, "algorithm.max_consecutive_skips must be >= 1")

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
    _require(s.logprob_micro_batch_size >= 1, "sizes.logprob_micro_batch_size must be >= 1")

    _require(o.name in ("adamw", "sgd"), f"optim.name={o.name!r}: use 'adamw' or 'sgd'")
    _require(o.lr > 0, f"optim.lr={o.lr} must be > 0")
    _require(o.warmup_steps >= 0, f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    _require(o.lr_schedule in LR_SCHEDULES,
             f"optim.lr_schedule={o.lr_schedule!r}: use one of {list(LR_SCHEDULES)}")
    _require(o.scheduler_interval in ("optimizer_step", "phase"),
             f"optim.scheduler_interval={o.scheduler_interval!r}: use 'optimizer_step' (ours) or 'phase' (official)")
    _require(o.grad_clip is None or o.grad_clip > 0, f"optim.grad_clip={o.grad_clip} must be > 0 or null")

    m, r = cfg.model, cfg.rollout
    _require(m.logprob_impl in ("fused", "naive"), f"model.logprob_impl={m.logprob_impl!r}: use 'fused' or 'naive'")
    _require(m.dtype in ("float32", "bfloat16", "float16"), f"model.dtype={m.dtype!r}: float32, bfloat16 or float16")
    _require(m.ref_dtype in (None, "float32", "bfloat16", "float16"),
             f"model.ref_dtype={m.ref_dtype!r}: float32, bfloat16, float16 or null (= model.dtype)")
    _require(r.backend in ("hf", "vllm"), f"rollout.backend={r.backend!r}: use 'hf' or 'vllm'")
    _require(r.temperature > 0, f"rollout.temperature={r.temperature} must be > 0 for training rollouts "
             "(log-probs are computed from logits / T)")
    _require(0 < r.top_p <= 1, f"rollout.top_p={r.top_p} must lie in (0, 1]")
    _require(r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens} must be >= 1")
