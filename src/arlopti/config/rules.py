"""The cross-field rules of a run config, each stated once, each error naming the key and the fix.

:func:`validate_run` runs the generic field checks (:func:`arlopti.config.check.check_fields`),
then these rules. A rule that code outside the config also needs (an algorithm's own guard on
its arguments) is a public function here that both call, so that it exists in one place:
:func:`check_mis_bounds`, :func:`check_rollout_correction_logprobs`, :func:`check_rollout_offload`,
:func:`effective_correction_mode`.
``python train.py`` validates once, in :func:`arlopti.entry.train.build`, with the Trainer's real
world size (:func:`validate_once`).
"""

from __future__ import annotations

import logging
import math

from arlopti.config.check import check_fields
from arlopti.config.schema import (AlgorithmConfig, ConfigError, OptimConfig, RolloutConfig, RolloutCorrectionConfig,
                                   RunConfig)

log = logging.getLogger(__name__)
_warned: set[str] = set()  # warnings already logged by this process (each once)


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


def check_mis_bounds(mis_low: float, mis_high: float) -> None:
    """MIS keeps a token whose ratio w lies in ``[mis_low, mis_high]``; the band must be a real
    interval of ratios: ``0 <= mis_low < mis_high``. The config (mode ``mis``) and
    :func:`arlopti.plugins.mismatch.correction_weights` both call this."""
    _require(0 <= mis_low < mis_high,
             f"algorithm.rollout_correction.mis_low={mis_low} must be >= 0 and below mis_high={mis_high}: "
             "set 0 <= mis_low < mis_high")


def check_overlong_buffer(buffer: int, max_new_tokens: int) -> None:
    """DAPO's overlong shaping ramps over the last ``buffer`` tokens before ``max_new_tokens``, so the
    buffer may be at most that length (equal: the ramp starts at length 0, as verl allows). The
    config and :func:`arlopti.plugins.dapo.overlong_penalty` both call this."""
    _require(buffer <= max_new_tokens,
             f"algorithm.dapo.overlong_buffer={buffer} exceeds rollout.max_new_tokens={max_new_tokens}: "
             "every response would be penalised; use a buffer <= the maximum length")


def check_rollout_correction_logprobs(mode: str, return_logprobs: bool) -> None:
    """A rollout correction other than ``none`` weighs tokens by the engine's sampling log-probs,
    so it needs ``rollout.return_logprobs=true``. The config and the learner both call this."""
    _require(mode == "none" or return_logprobs,
             f"algorithm.rollout_correction.mode={mode} needs the engine's log-probs: set rollout.return_logprobs=true")


def effective_correction_mode(rollout: RolloutConfig, correction: RolloutCorrectionConfig) -> str:
    """The rollout correction a run applies: ``algorithm.rollout_correction.mode`` as given, except
    ``auto`` (the default), which is ``tis`` when ``rollout.placement=server`` and
    ``rollout.async.max_staleness > 0`` (samples from older weights: NeMo-RL's async GRPO guide calls
    the importance-sampling correction required for convergence), else ``none`` (every colocated or
    synchronous run trains exactly as before ``auto`` existed). The config and the learner both call this."""
    if correction.mode != "auto":
        return correction.mode
    off_policy = rollout.placement == "server" and rollout.async_.max_staleness > 0
    return "tis" if off_policy else "none"


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


#: The most batches placement=server generates ahead and holds (rollout.async.max_staleness + 1 at most).
MAX_STALENESS = 32


def worker_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a rollout worker given as ``host:port`` or ``http(s)://host:port``; None when it is
    not one (no port, a port outside 1..65535, a space in it)."""
    from urllib.parse import urlsplit

    text = url.strip()
    if not text or " " in text:
        return None
    try:
        parts = urlsplit(text if "://" in text else f"http://{text}")
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or not 1 <= port <= 65535:
        return None
    return parts.hostname, port


def _validate_server(cfg: RunConfig, world_size: int) -> None:
    """``rollout.placement=server``: what it cannot run with yet, and where its workers come from."""
    r = cfg.rollout
    if r.placement != "server":
        return
    not_built = "is not built yet for rollout.placement=server"
    _require(not cfg.algorithm.dapo.dynamic_sampling,
             f"algorithm.dapo.dynamic_sampling=true {not_built} (its extra generation rounds would need the "
             "workers' queue to refill mid-step); set algorithm.dapo.dynamic_sampling=false or "
             "rollout.placement=colocated")
    s = r.server
    _require(s.spawn or bool(s.urls),
             "rollout.server.spawn=false with empty rollout.server.urls: there is no worker to generate; list the "
             "workers started with python -m arlopti.rollout.serve in rollout.server.urls (host:port), or set "
             "rollout.server.spawn=true")
    _require(not (s.spawn and s.urls),
             f"rollout.server.spawn=true with rollout.server.urls={list(s.urls)}: spawned workers take their own "
             "ports, so the urls would be ignored; set rollout.server.urls=[] to spawn, or "
             "rollout.server.spawn=false to connect to those workers")
    _require(not s.devices or (s.spawn and len(s.devices) == s.num_workers * world_size),
             f"rollout.server.devices={list(s.devices)} names the GPU of each spawned worker: give one per worker "
             f"(rollout.server.num_workers={s.num_workers} per trainer rank x {world_size} rank(s)) with "
             "rollout.server.spawn=true, or devices=[] to let the workers inherit their rank's CUDA_VISIBLE_DEVICES")
    _require(s.spawn or len(s.urls) % world_size == 0,
             f"rollout.server.urls lists {len(s.urls)} worker(s) for {world_size} trainer ranks: each rank drives "
             "its own share of the workers (rank r the r-th contiguous share), so give a multiple of the ranks")
    for url in s.urls:
        _require(worker_address(url) is not None,
                 f"rollout.server.urls has {url!r}, which is not host:port (a port in 1..65535, e.g. 127.0.0.1:8100 "
                 "or http://gpu7:8100): give each worker as its python -m arlopti.rollout.serve printed it")
    _require(r.async_.max_staleness <= MAX_STALENESS,
             f"rollout.async.max_staleness={r.async_.max_staleness}: at most {MAX_STALENESS} batches are generated "
             "ahead and held (each holds a whole step's episodes); beyond a few steps staleness hides no more "
             f"generation time (docs/scaling.md): use a value <= {MAX_STALENESS}")
    _require(not (cfg.model.lora.r and r.lora_sync == "adapter"),
             "rollout.lora_sync=adapter is not served by rollout workers (rollout.placement=server): a worker "
             "would have to read each adapter from a folder the trainer writes; use rollout.lora_sync=merged "
             "(after the first sync only the adapted weights are sent) or rollout.placement=colocated")


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
    _validate_lora_sync(cfg)
    _validate_server(cfg, world_size)
    _validate_algorithm(cfg.algorithm, r)
    check_dppo_anchor(cfg.algorithm.policy_loss, cfg.algorithm.loss_params.dppo_anchor, r.return_logprobs)


def _validate_lora_sync(cfg: RunConfig) -> None:
    """``rollout.lora_sync=adapter`` (not the default) is read by a vLLM engine of a LoRA run only."""
    r, lora = cfg.rollout, cfg.model.lora
    if r.lora_sync != "adapter":
        return
    _require(bool(lora.r), "rollout.lora_sync=adapter applies to LoRA runs, and model.lora.r=0 trains every "
             "parameter (every weight is sent); set model.lora.r > 0 or drop rollout.lora_sync")
    _require(r.backend == "vllm" or r.placement == "server",
             f"rollout.lora_sync=adapter is how a vLLM engine follows the adapter, and rollout.backend={r.backend} "
             "samples from the policy itself; drop rollout.lora_sync or use rollout=vllm")


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
_NO_DUAL_CLIP = ("gspo", "cispo", "sapo", "simko")
_REQUIRED_AGG = {"gspo": "seq-mean-token-mean"}
#: Losses that do not read clip_low / clip_high as PPO clip bounds (DPPO: divergence thresholds; SAPO: no clip).
_NO_CLIP_BOUNDS = ("dppo_tv", "dppo_kl", "sapo", "gspo")


def check_dppo_anchor(policy_loss: str, anchor: str, return_logprobs: bool) -> None:
    """``algorithm.loss_params.dppo_anchor=engine`` measures DPPO's trust region from the engine's log-probs:
    it needs them (``rollout.return_logprobs``), and it is read by ``dppo_*`` only."""
    if anchor != "engine":
        return
    _require(policy_loss in ("dppo_tv", "dppo_kl"),
             f"algorithm.loss_params.dppo_anchor=engine is read by the dppo_* losses only, and algorithm.policy_loss="
             f"{policy_loss}; drop it or use algorithm.policy_loss=dppo_tv / dppo_kl")
    _require(return_logprobs, "algorithm.loss_params.dppo_anchor=engine needs the engine's log-probs: set "
             "rollout.return_logprobs=true, or dppo_anchor=old")


def check_dual_clip(policy_loss: str, dual_clip: float | None) -> None:
    """GSPO, CISPO, SAPO and SimKO take no dual-clip. The config and those losses
    (:mod:`arlopti.algorithms.policy_loss`, :mod:`arlopti.plugins.rival_losses`) both call this."""
    if policy_loss in _NO_DUAL_CLIP:
        _require(dual_clip is None, f"algorithm.dual_clip={dual_clip}: algorithm.policy_loss={policy_loss} has "
                 f"no dual-clip; set algorithm.dual_clip=null (algorithm={policy_loss} sets it)")


def _validate_algorithm(a: AlgorithmConfig, r: RolloutConfig) -> None:
    """Combinations of algorithm pieces that cannot apply together, each named with its fix."""
    fix = f" (algorithm={a.policy_loss} sets it)"
    check_dual_clip(a.policy_loss, a.dual_clip)
    need = _REQUIRED_AGG.get(a.policy_loss)
    if need is not None:
        _require(a.loss_agg == need, f"algorithm.loss_agg={a.loss_agg} cannot apply to algorithm.policy_loss="
                 f"{a.policy_loss}: its sequence-level ratio is one value per response, so responses must weigh "
                 f"equally; set algorithm.loss_agg={need}" + fix)
    _check_sapo_empty_rows(a)
    _require(a.otb_zero_tail or a.advantage == "otb", "algorithm.otb_zero_tail=false is read by "
             f"algorithm.advantage=otb only, and algorithm.advantage={a.advantage}; drop it or use experiment=kk_otb")
    _validate_correction(a.rollout_correction, r)
    _validate_token_method(a)
    d = a.dapo
    check_overlong_buffer(d.overlong_buffer, r.max_new_tokens)
    _validate_turns(a, r)


def _check_sapo_empty_rows(a: AlgorithmConfig) -> None:
    """``loss_params.sapo_empty_rows=zero`` changes SAPO's mean over responses; elsewhere it would change nothing."""
    if a.loss_params.sapo_empty_rows == "skip":
        return
    _require(a.policy_loss == "sapo" and a.loss_agg != "token-mean",
             f"algorithm.loss_params.sapo_empty_rows={a.loss_params.sapo_empty_rows} is how SAPO's mean over "
             f"responses counts an empty one, and algorithm.policy_loss={a.policy_loss} with algorithm.loss_agg="
             f"{a.loss_agg} takes no such mean; drop it, or use experiment=kk_sapo (policy_loss=sapo, "
             "loss_agg=seq-mean-token-mean)")


def _validate_turns(a: AlgorithmConfig, r: RolloutConfig) -> None:
    """Multi-turn episodes (``rollout.max_turns > 1``): what is defined on one response does not apply."""
    if r.max_turns == 1:
        return
    _require(a.dapo.overlong_buffer == 0,
             f"algorithm.dapo.overlong_buffer={a.dapo.overlong_buffer} with rollout.max_turns={r.max_turns}: DAPO's "
             "overlong penalty ramps over the last tokens before one response's limit, and a multi-turn episode has "
             "a limit per turn and one for the whole episode (model and environment tokens); set "
             "algorithm.dapo.overlong_buffer=0 (a truncated episode can still leave the loss: "
             "algorithm.dapo.mask_truncated=true)")
    _require(r.episode_tokens >= r.max_turns,
             f"rollout.max_episode_tokens={r.max_episode_tokens} leaves less than one token per turn for "
             f"rollout.max_turns={r.max_turns}; raise it (null = max_turns x max_new_tokens)")


def _validate_correction(rc: RolloutCorrectionConfig, r: RolloutConfig) -> None:
    """The rollout correction's rules, on its effective mode (:func:`effective_correction_mode`)."""
    mode = effective_correction_mode(r, rc)
    k = r.async_.max_staleness
    if rc.mode == "auto" and mode != "none":
        _require(r.return_logprobs,
                 f"algorithm.rollout_correction.mode=auto is {mode} here (rollout.placement=server, "
                 f"rollout.async.max_staleness={k} > 0) and needs the engine's log-probs: set "
                 "rollout.return_logprobs=true (or algorithm.rollout_correction.mode=none to train uncorrected)")
    check_rollout_correction_logprobs(mode, r.return_logprobs)
    if mode == "mis":
        check_mis_bounds(rc.mis_low, rc.mis_high)
    if rc.mode == "none" and r.placement == "server" and k > 0:
        _warn_once(f"algorithm.rollout_correction.mode=none with rollout.async.max_staleness={k}: samples from "
                   "weights up to k steps old are trained without an importance-sampling correction, which "
                   "NeMo-RL's async GRPO guide calls required for convergence; mode=auto (the default) uses tis")


def _validate_token_method(a: AlgorithmConfig) -> None:
    """Token methods that cannot compose with the rest (arlopti.plugins.token_methods' docstring)."""
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
        _require(a.policy_loss not in _NO_CLIP_BOUNDS, f"{key} cannot apply to algorithm.policy_loss={a.policy_loss}: "
                 "it reads no per-token PPO clip bounds (gspo: one sequence ratio; dppo_*: divergence thresholds; "
                 "sapo: no clip); use ppo_clip, cispo, ce_gppo, aspo or simko")
    if tm.name == "lp_reg":
        _require(a.policy_loss == "ppo_clip", f"{key} needs algorithm.policy_loss=ppo_clip (it lifts the PPO clip "
                 f"of the tokens it regularises, as Lp-Reg's loss does), not {a.policy_loss}")
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
