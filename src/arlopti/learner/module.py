"""``GRPOModule``: the learner. GRPO, Advantage Reweighting and Lopti with manual optimisation.

One ``training_step`` consumes one rollout step (the :class:`Experience` the rollout callback
attached to the batch) and does exactly this:

1. old log-probs ``logπ_old`` of the sampled tokens with the current weights (no grad, at the
   rollout temperature T) and, when β > 0, reference log-probs from the frozen initial policy;
2. advantages: the configured estimator (``algorithm.advantage``, ``grpo`` by default) on the
   token rewards (the outcome on the last token; minus β·KL per token under ``kl_in=reward``);
   then AR, ``A ← (α·p_old + 1 − α)·A``, once, before any update (docs/algorithms.md);
3. the phase plan: GRPO has one phase (all tokens); Lopti has ``[low, high]`` split at
   ``p_old < η`` (``reverse`` swaps them);
4. optimizer steps. ``granularity=batch`` (official): for each phase, a full pass over all
   mini-batches → steps ``[low mb1 … low mbK, high mb1 … high mbK]``. ``granularity=minibatch``:
   ``[low mb1, high mb1, low mb2, …]``. Each step: zero grads, accumulate micro-batch
   gradients (``manual_backward``) of :func:`~arlopti.algorithms.grpo_objective` (the policy
   loss ``algorithm.policy_loss``, times the rollout correction's weight), clip by global norm,
   ``opt.step()``, scheduler step. ``ppo_epochs`` repeats the whole plan. Under
   ``dapo.mask_truncated`` truncated responses are masked out of all of it, after step 2 has
   used their rewards in their groups' advantages.

Forward passes (none wasted). The no-grad passes of step 1 run longest response first in chunks
of ``sizes.logprob_micro_batch_size`` (:func:`~arlopti.learner.policy.fill_logprobs`) under
Lightning's precision context; β = 0 runs no reference pass. The first optimizer step runs before
any update, so its training forward *is* ``logπ_old`` for its rows: they skip the no-grad pass,
and their ``logπ_old``, AR weights and phase mask come from that forward
(:func:`~arlopti.algorithms.plan.first_step_inputs`); whether that phase is empty on every rank
is decided after its backwards. Equal to the separate pass to float rounding
(tests/learner/test_forward_reuse.py); not under ``lopti.normalize=phase``;
``reuse_old_logprobs = False`` switches it off.

Micro-batches: ``sizes.micro_batch_size`` rows, or packed under ``sizes.micro_batch_tokens``
(:mod:`arlopti.learner.microbatch`).

Loss normaliser (``algorithm.token_mean_scope``): ``minibatch`` (default) divides every
micro-batch's token sum by the valid-token count of the *whole mini-batch summed over ranks*,
so a step's gradient is the exact token-mean over the mini-batch however it is split across
micro-batches and ranks (verl's global token-mean). ``microbatch`` is the official verl-0.2
behaviour: each micro-batch's own token-mean divided by the number of micro-batches, so the
update depends on the split by definition (also with a token budget, where the split follows
the lengths). Under Lopti both phases divide by *all* valid tokens (``lopti.normalize=all``,
official) or by the phase's own (``phase``).

Empty phases (``algorithm.lopti.empty_phase``): ``skip`` (ours) - a phase with no tokens on any
rank (e.g. no token with p_old < η) takes no optimizer step and is logged as
``update/<phase>/skipped_empty``; Adam's moments and step count are then untouched, so the next
step's bias correction is as if the phase never existed. ``step`` (official) - the phase's
mini-batches run as usual: zero loss, zero gradients, and an AdamW step in which weight decay
and the moments act and the step count advances.

Non-finite loss or gradient norm: the step is skipped (gradients dropped, no optimizer or
scheduler step), logged as ``update/nonfinite_skips``, and training continues; after
``algorithm.max_consecutive_skips`` skipped steps in a row it aborts with a clear message.
A step with a finite loss and gradient that still leaves non-finite weights (a huge learning
rate) aborts the run at once (:class:`NonFiniteAbort` naming the rollout step, lr, loss and
gradient norm), before any checkpoint can save those weights: every optimizer step is followed
by one fused finiteness reduction over the parameters (benchmarks/RESULTS.md: its cost).

Distributed (``trainer=ddp`` or ``trainer=fsdp``): each rank holds whole prompts, so whole
GRPO groups; DDP and FSDP2 average gradients over ranks, hence the ``/ world`` in the loss
normaliser above. ``configure_model`` applies FSDP2 (:mod:`arlopti.learner.sharding`) when the
strategy is a ``ModelParallelStrategy``. Every decision that changes the control flow (empty
phase, non-finite skip) is taken on all-reduced values, so the ranks never diverge.
Gradient clipping uses the global norm (DTensor gradients under FSDP2, already-averaged
gradients under DDP).

Metrics: every algorithm logs the same core tags per rollout step (``update/loss``, ``update/kl``,
``update/entropy``, ``update/clip_frac_*``, ``update/grad_norm``, ``update/lr``, ``update/ratio_*``),
combined over the step's phases and micro-batches token-weighted; Lopti adds the same per phase
(``update/low/*``, ``update/high/*``). Each metric declares how it combines over ranks where it is
produced (:mod:`arlopti.learner.step_metrics`). docs/metrics.md lists every tag.

Counters: Lightning's ``global_step`` counts optimizer steps (so Lopti doubles it);
``rollout_step`` counts training steps (TensorBoard's x-axis, checkpoint cadence) and
``weight_version`` increments on every optimizer step (the rollout engine syncs on it).

Learning rate: constant after ``optim.warmup_steps`` of linear warm-up. Ours
(``optim.lr_schedule=linear_warmup``, ``optim.scheduler_interval=optimizer_step``): stepped per
optimizer step, step 0 runs at lr/warmup or lr. Official (``verl``, ``phase``; set together by
``fidelity=official``): verl's constant-with-warmup multiplier ``min(1, s / max(1, warmup))``,
stepped once per phase pass, so the run's very first phase pass runs at lr = 0.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

import lightning.pytorch as L
import torch
from torch import Tensor

from arlopti.algorithms import (ADVANTAGE_ESTIMATORS, Phase, advantage_reweight, grpo_objective, kl_penalty,
                                normaliser, phase_plan)
from arlopti.algorithms.advantages import outcome_token_rewards
from arlopti.algorithms.mismatch import correction_weights
from arlopti.algorithms.plan import first_step_inputs, phase_names, phase_pass_ends, step_order
from arlopti.config import RunConfig, validate_once
from arlopti.learner.experience import Experience, experience_of, to_device, without_truncated
from arlopti.learner.mismatch_metrics import add_mismatch_metrics
from arlopti.learner.guard import NonFiniteAbort, NonFiniteGuard, tensors_finite
from arlopti.learner.optim import build_optimizer
from arlopti.learner.microbatch import micro_batches_of
from arlopti.learner.checkpoint_state import check_policy_keys, drop_reference_weights, learner_state, rank_rng_state
from arlopti.learner.lora import adapters_disabled, apply_lora, check_base_identity, lora_enabled
from arlopti.learner.policy import PolicyLM, disable_dropout, fill_logprobs
from arlopti.learner.step_logging import write_hparams, write_step
from arlopti.learner.step_metrics import MetricSet, add_objective_metrics, padding_metrics, rollout_metrics
from arlopti.models import load_causal_lm
from arlopti.utils.rng import restore_rng_state

log = logging.getLogger(__name__)

__all__ = ["GRPOModule", "NonFiniteAbort", "StepContext"]




@dataclass
class StepContext:
    """What one training step computed, for diagnostics callbacks (read in on_train_batch_end)."""

    experience: Experience
    old_log_probs: Tensor  # [B, R]
    advantages_raw: Tensor  # [B, R] before AR
    advantages: Tensor  # [B, R] after AR
    phases: list[Phase]
    metrics: dict[str, float]


@dataclass
class _Targets:
    """The per-token inputs of a rollout step's updates. ``adv``/``phases``/``empty`` are None
    while the reused first step is still filling ``old`` from its own forward."""

    old: Tensor  # [B, R] logπ_old
    ref: Tensor | None  # [B, R] reference log-probs (β > 0)
    adv_raw: Tensor  # [B, R] advantages before AR
    adv: Tensor | None = None  # after AR
    phases: dict[str, Phase] | None = None
    empty: dict[str, bool] | None = None  # phase -> no token on any rank


class GRPOModule(L.LightningModule):
    """See the module docstring. ``cfg`` is a validated :class:`~arlopti.config.RunConfig`;
    ``task_options`` (the run's ``tasks`` node) go to the rollout callback it brings."""

    #: Take the first optimizer step's old log-probs from its own training forward (module
    #: docstring, "Forward passes"); tests switch it off to compare with the separate pass.
    reuse_old_logprobs: bool = True

    def __init__(self, cfg: RunConfig, tokenizer=None, total_rollout_steps: int | None = None,
                 log_completions: int = 2, task_options: dict | None = None, data_signature: dict | None = None):
        super().__init__()
        self.automatic_optimization = False
        validate_once(cfg)  # a no-op when train.build validated this config already (once per start)
        self.cfg = cfg
        # data_signature: the data config's identity (arlopti.train.data_signature), checked on resume
        self.save_hyperparameters({"run": asdict(cfg), **({"data": dict(data_signature)} if data_signature else {})})
        self.tokenizer = tokenizer
        self.total_rollout_steps = total_rollout_steps
        self.log_completions = log_completions
        self.task_options = dict(task_options or {})
        self.lora = lora_enabled(cfg.model.lora)  # LoRA: the reference is the policy with its adapters off
        self.policy = PolicyLM(apply_lora(self._load_model(cfg.model.dtype), cfg.model.lora,
                                          cfg.model.gradient_checkpointing), cfg.model.logprob_impl)
        self.ref: PolicyLM | None = None
        if cfg.algorithm.kl_coef > 0 and not self.lora:  # β = 0 loads no reference model
            self.ref = PolicyLM(self._load_model(cfg.model.ref_dtype or cfg.model.dtype), cfg.model.logprob_impl)
            self.ref.requires_grad_(False)
            self.ref.eval()
        if cfg.model.gradient_checkpointing:
            self.policy.hf.gradient_checkpointing_enable()
        self.rollout_step = 0
        self.weight_version = 0
        self.guard = NonFiniteGuard(cfg.algorithm.max_consecutive_skips)
        self.last_step_context: StepContext | None = None
        # The reference model is rebuilt from the config, never saved: its weights are dropped from
        # every state_dict (so that distributed checkpoints do not expect them back) and loading is
        # not strict; on_load_checkpoint checks the policy's keys itself.
        self.strict_loading = False
        self.register_state_dict_post_hook(drop_reference_weights)
        self._pending_rng: dict | None = None
        self._warned_oversized = False

    # ------------------------------------------------------------------ set-up
    def _load_model(self, dtype: str):
        m = self.cfg.model
        model = load_causal_lm(m.name_or_path, self.tokenizer, dtype=dtype, tiny=m.tiny)
        disable_dropout(model)
        return model

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature

    @property
    def world(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    @property
    def total_skips(self) -> int:
        return self.guard.total

    def setup(self, stage: str) -> None:
        validate_once(self.cfg, world_size=self.world)  # skipped when already validated for this world size

    def configure_callbacks(self):
        """The rollout callback the learner cannot run without (unless the trainer already has one)."""
        from arlopti.callbacks.rollout import RolloutCallback

        if self._trainer is not None and any(isinstance(c, RolloutCallback) for c in self.trainer.callbacks):
            return []
        return [RolloutCallback(group_size=self.cfg.sizes.group_size, task_kwargs=self.task_options)]

    def configure_model(self) -> None:
        """FSDP2 under a ``ModelParallelStrategy``: shard the policy and the reference. Idempotent."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if self._trainer is not None and isinstance(self.trainer.strategy, ModelParallelStrategy):
            from arlopti.learner.sharding import shard_learner

            shard_learner(self.policy, self.ref, self.trainer.strategy, self.device_mesh,
                          self.cfg.model.decoder_layer_class)

    def configure_optimizers(self):
        opt, sched = build_optimizer([p for p in self.policy.parameters() if p.requires_grad], self.cfg.optim)
        return [opt], [{"scheduler": sched, "interval": "step"}]

    # ------------------------------------------------------------------ collectives
    def _all_reduce(self, value: float, op: str = "sum") -> float:
        """Reduce a scalar over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return float(value)
        t = torch.tensor(float(value), device=self.device, dtype=torch.float64)
        return float(self.trainer.strategy.reduce(t, reduce_op=op))

    def _sum_over_ranks(self, t: Tensor) -> Tensor:
        """Sum a tensor over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return t
        return self.trainer.strategy.reduce(t.to(self.device), reduce_op="sum")

    def _micro_batches(self, rows: list[int], exp: Experience) -> list[list[int]]:
        """Micro-batches of mini-batch ``rows`` (:func:`~arlopti.learner.microbatch.micro_batches_of`);
        with a token budget their count is the max over ranks (each backward is a collective)."""
        s = self.cfg.sizes
        rows_mb, oversized = micro_batches_of(rows, exp, s.micro_batch_size, s.micro_batch_tokens,
                                              lambda k: int(self._all_reduce(k, "max")))
        if oversized and not self._warned_oversized:
            self._warned_oversized = True
            log.warning("%s (warned once)", oversized)
        return rows_mb

    # ------------------------------------------------------------------ the step
    def training_step(self, batch, batch_idx: int):
        sampled = to_device(experience_of(batch), self.device)
        a, s = self.cfg.algorithm, self.cfg.sizes
        exp = without_truncated(sampled) if a.dapo.mask_truncated else sampled  # what the loss sees
        t0 = time.perf_counter()
        rows = list(range(len(exp)))
        per_rank = s.mini_batch_size // self.world
        minis = [rows[i:i + per_rank] for i in range(0, len(rows), per_rank)]
        names = phase_names(a.lopti.eta if a.lopti.enabled else None, a.lopti.reverse)
        order = step_order(names, minis, a.ppo_epochs, a.lopti.granularity)
        reuse = self._reuses_first_forward()
        # 1. old and reference log-probs (no grad); the first step's rows come from its own forward
        targets = self._log_probs(exp, skip=set(order[0][1]) if reuse else set())
        targets.adv_raw = self._advantages(sampled, targets, loss_mask=exp.response_mask)
        t_logp = time.perf_counter() - t0
        if not reuse:
            self._complete(targets, exp)
        # 2. the optimizer steps, in the planned order
        micro_plan = {tuple(mb): self._micro_batches(mb, exp) for mb in minis}
        metrics = MetricSet()
        for (phase, mb), pass_ends in zip(order, phase_pass_ends(order)):
            if targets.empty is None or not (targets.empty[phase] and a.lopti.empty_phase == "skip"):
                self._update(exp, phase, mb, micro_plan[tuple(mb)], targets, metrics, prefixes=_prefixes(names, phase))
            if pass_ends and self.cfg.optim.scheduler_interval == "phase":
                self.lr_schedulers().step()
        # 3. metrics
        self.rollout_step += 1
        timings = {"logprobs_s": t_logp, "update_s": time.perf_counter() - t0 - t_logp, **exp.timings}
        self._step_metrics(metrics, sampled, targets, names, micro_plan, timings,
                           reused=len(order[0][1]) if reuse else 0)
        self._finish_step(batch, sampled, targets, metrics)
        return None

    def _reuses_first_forward(self) -> bool:
        """Whether the first optimizer step takes its rows' old log-probs from its own forward
        (:func:`~arlopti.algorithms.plan.first_step_inputs`). Not with ``lopti.normalize=phase``: its
        loss denominator is the phase's token count over the whole mini-batch, needed before the
        first micro-batch's backward; nor with ``kl_in=reward``: the advantages need every token's
        logπ_old before any backward."""
        a = self.cfg.algorithm
        kl_reward = a.kl_in == "reward" and a.kl_coef > 0
        return self.reuse_old_logprobs and not (a.lopti.enabled and a.lopti.normalize == "phase") and not kl_reward

    def _advantages(self, exp: Experience, t: _Targets, loss_mask: Tensor) -> Tensor:
        """Token advantages ``[B, R]`` before AR: the outcome reward on each response's last token,
        minus β·KL(logπ_old, logπ_ref) per token under ``kl_in=reward``, through the configured
        estimator (:mod:`arlopti.algorithms.advantages`; batch statistics summed over ranks).
        ``exp`` is every sampled response: under ``dapo.mask_truncated`` a truncated response's
        reward still enters its group's statistics, and only then is it zeroed by ``loss_mask``
        (TRL's ``mask_truncated_completions`` order; docs/algorithms.md)."""
        a = self.cfg.algorithm
        rewards = outcome_token_rewards(exp.rewards, exp.response_mask)
        if a.kl_in == "reward" and t.ref is not None:  # logπ_old is zero on masked rows: KL only where the loss is
            rewards = rewards - a.kl_coef * kl_penalty(t.old, t.ref, a.kl_estimator) * loss_mask
        adv = ADVANTAGE_ESTIMATORS.get(a.advantage)(rewards, exp.response_mask, exp.group_ids, eps=a.adv_eps,
                                                    gamma=a.gamma, reduce=self._sum_over_ranks)
        return adv if loss_mask is exp.response_mask else adv * loss_mask

    def _log_probs(self, exp: Experience, skip: set[int]) -> _Targets:
        """``logπ_old`` of every row not in ``skip`` and the reference log-probs of all rows, no grad,
        at the rollout temperature, under Lightning's precision context; zeros on padding."""
        mask = exp.response_mask
        old = torch.zeros_like(mask)
        was_training = self.policy.training
        self.policy.eval()
        chunk = self.cfg.sizes.logprob_micro_batch_size
        fill_logprobs(self.policy, exp, [i for i in range(len(exp)) if i not in skip], old, chunk, self.temperature)
        ref = None
        if self.ref is not None:
            ref = torch.zeros_like(mask)
            fill_logprobs(self.ref, exp, list(range(len(exp))), ref, chunk, self.temperature)
        elif self.lora and self.cfg.algorithm.kl_coef > 0:
            ref = torch.zeros_like(mask)
            with adapters_disabled(self.policy):
                fill_logprobs(self.policy, exp, list(range(len(exp))), ref, chunk, self.temperature)
        self.policy.train(was_training)
        return _Targets(old=old * mask, ref=ref, adv_raw=torch.zeros_like(mask))

    def _complete(self, t: _Targets, exp: Experience) -> None:
        """AR once, the phase masks, and which phases are empty on every rank (collective)."""
        a = self.cfg.algorithm
        t.adv = advantage_reweight(t.adv_raw, t.old, a.ar_alpha) if a.ar_alpha > 0 else t.adv_raw
        phases = phase_plan(exp.response_mask, t.old, a.lopti.eta if a.lopti.enabled else None, a.lopti.reverse)
        t.phases = {ph.name: ph for ph in phases}
        t.empty = {ph.name: self._all_reduce(float(ph.token_mask.sum())) == 0 for ph in phases}

    def _update(self, exp: Experience, phase: str, rows: list[int], micros: list[list[int]], t: _Targets,
                metrics: MetricSet, prefixes: list[str]) -> None:
        """One optimizer step: accumulate the mini-batch's gradients, then apply or skip."""
        filling = t.adv is None  # the reused first step: its forward is logπ_old
        loss = self._accumulate(exp, phase, rows, micros, t, metrics, prefixes)
        if filling:
            self._complete(t, exp)
        if t.empty[phase] and self.cfg.algorithm.lopti.empty_phase == "skip":
            self.optimizers().zero_grad(set_to_none=True)  # a phase with no token: its loss was zero
            return
        self._step_or_skip(loss, metrics, prefixes)

    def _accumulate(self, exp: Experience, phase: str, rows: list[int], micros: list[list[int]], t: _Targets,
                    metrics: MetricSet, prefixes: list[str]) -> float:
        """Zero the gradients and back-propagate every micro-batch of mini-batch ``rows`` for
        ``phase``; returns the summed loss. Under ``token_mean_scope=minibatch`` every micro-batch
        divides by the mini-batch's valid-token count over all ranks (DDP/FSDP average gradients over
        ranks, hence the ``/ world``); under ``microbatch`` by its own, then by the micro-batch count."""
        a = self.cfg.algorithm
        self.optimizers().zero_grad(set_to_none=True)
        idx_rows = torch.tensor(rows, device=exp.input_ids.device)
        phase_only = t.phases is not None and a.lopti.normalize != "all"
        denom = t.phases[phase].token_mask[idx_rows].float() if phase_only else exp.response_mask[idx_rows]
        scale = max(self._all_reduce(normaliser(denom, a.loss_agg)) / self.world, 1e-8) \
            if a.token_mean_scope == "minibatch" else None
        total = 0.0
        for micro in micros:
            sub, idx = exp.select(micro), torch.tensor(micro, device=exp.input_ids.device)
            r = sub.response_mask.shape[1]
            logp, ent = self.policy(sub.input_ids, sub.attention_mask, sub.prompt_len, self.temperature,
                                    with_entropy=True)
            if t.adv is None:
                old, adv, pmask = first_step_inputs(logp, sub.response_mask, t.adv_raw[idx, :r], a.ar_alpha, phase,
                                                    a.lopti.eta if a.lopti.enabled else None)
                t.old[idx, :r] = old
            else:
                old, adv, pmask = t.old[idx, :r], t.adv[idx, :r], t.phases[phase].token_mask[idx, :r]
            loss, m = grpo_objective(logp, old, adv, sub.response_mask, pmask, a,
                                     ref_log_probs=None if t.ref is None else t.ref[idx, :r], entropy=ent, scale=scale,
                                     horizon=self.cfg.rollout.max_new_tokens, normalize=a.lopti.normalize,
                                     token_weight=self._correction(old, sub), base_advantages=t.adv_raw[idx, :r])
            if scale is None:
                loss = loss / len(micros)
            self.manual_backward(loss)
            total += float(loss.detach())
            add_objective_metrics(metrics, prefixes, m)
        return total

    def _correction(self, old: Tensor, sub: Experience) -> Tensor | None:
        """The rollout-mismatch weight of one micro-batch (``algorithm.rollout_correction``), or None."""
        rc = self.cfg.algorithm.rollout_correction
        if rc.mode == "none":
            return None
        if sub.engine_logprobs is None:
            raise RuntimeError("algorithm.rollout_correction needs the engine's log-probs: set rollout.return_logprobs=true")
        return correction_weights(old, sub.engine_logprobs, sub.response_mask, rc.mode, cap=rc.cap,
                                  mis_low=rc.mis_low, mis_high=rc.mis_high)

    def _step_or_skip(self, loss: float, metrics: MetricSet, prefixes: list[str]) -> None:
        """Clip by the global norm and step, or skip a non-finite step (decided over all ranks)."""
        grad_norm = self._clip_and_norm()
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if self.world > 1:  # one rank's NaN loss must skip the step everywhere, or the ranks diverge
            finite = self._all_reduce(0.0 if finite else 1.0) == 0
        if not self.guard.allow(finite, loss=loss, grad_norm=grad_norm, rollout_step=self.rollout_step):
            self.optimizers().zero_grad(set_to_none=True)
            return
        lr = float(self.optimizers().param_groups[0]["lr"])
        self.optimizers().step()
        self._check_weights(lr=lr, loss=loss, grad_norm=grad_norm)
        if self.cfg.optim.scheduler_interval == "optimizer_step":
            self.lr_schedulers().step()
        self.weight_version += 1
        for prefix in prefixes:
            metrics.add(f"{prefix}/grad_norm", grad_norm)
            metrics.add(f"{prefix}/steps", 1.0, "sum")

    def _check_weights(self, *, lr: float, loss: float, grad_norm: float) -> None:
        """After an optimizer step: are the updated parameters finite on every rank? (One fused
        reduction over this rank's parameters, :func:`~arlopti.learner.guard.tensors_finite`; one
        scalar all-reduce when distributed.) If not, abort before anything can checkpoint them."""
        finite = bool(tensors_finite(p for p in self.policy.parameters() if p.requires_grad))
        if self.world > 1:
            finite = self._all_reduce(0.0 if finite else 1.0, "max") == 0
        self.guard.check_weights(finite, rollout_step=self.rollout_step, lr=lr, loss=loss, grad_norm=grad_norm)

    def _clip_and_norm(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.optim.grad_clip
        if not params:
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------ metrics
    def _step_metrics(self, metrics: MetricSet, exp: Experience, t: _Targets, names: list[str],
                      micro_plan: dict, timings: dict[str, float], reused: int) -> None:
        skip_empty = self.cfg.algorithm.lopti.empty_phase == "skip"
        for name in names:
            if len(names) > 1:
                metrics.add(f"update/{name}/skipped_empty", float(t.empty[name] and skip_empty), "max")
        rollout_metrics(metrics, exp, t.old, list(t.phases.values()), self.cfg.algorithm.ar_alpha)
        if exp.engine_logprobs is not None:  # rollout.return_logprobs: the engine/trainer mismatch
            add_mismatch_metrics(metrics, t.old, exp.engine_logprobs, exp.response_mask)
        padding_metrics(metrics, exp, micro_plan)
        metrics.add("update/old_logprobs_reused_frac", reused / max(1, len(exp)))
        for k, v in timings.items():
            metrics.add(f"timing/{k}", v, "max")
        total_t = sum(timings.values())
        metrics.add("timing/tokens_per_s", float(exp.response_mask.sum()) / total_t if total_t > 0 else 0.0, "sum")
        metrics.add("update/lr", float(self.optimizers().param_groups[0]["lr"]))
        metrics.add("update/nonfinite_skips", float(self.guard.total), "max")
        metrics.add("update/optimizer_steps", float(self.trainer.global_step) if self._trainer else 0.0, "max")

    def _finish_step(self, batch, exp: Experience, t: _Targets, metrics: MetricSet) -> None:
        """Reduce and log the metrics, keep the step's context, mark the batch consumed, stop at the end."""
        values = metrics.as_dict() if self.world == 1 else metrics.reduce_over_ranks(
            lambda x, op: self.trainer.strategy.reduce(x, reduce_op=op), self.world, self.device)
        self.last_step_context = StepContext(exp, t.old, t.adv_raw, t.adv, list(t.phases.values()), values)
        self.log("reward", values["reward/mean"], prog_bar=True, logger=False, rank_zero_only=True)
        if self._trainer is None:
            return
        if self.trainer.global_rank == 0:
            write_step(self.loggers, values, exp, self.rollout_step, self.log_completions)
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "mark_consumed"):
            dm.mark_consumed(batch)
        if self.total_rollout_steps is not None and self.rollout_step >= self.total_rollout_steps:
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Counters and every rank's RNG states (collective when distributed: all ranks save)."""
        checkpoint["arlopti"] = learner_state(self.rollout_step, self.weight_version, self.guard.state_dict(),
                                              self.world)
        if self.lora:  # the checkpoint holds only the adapter: name the base it belongs to
            checkpoint["arlopti"]["lora_base"] = self.policy.hf.arlopti_base_identity
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("ref.")]:
            del state[key]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # single-file checkpoints; FSDP2 folders are checked by the DCP loader
            check_policy_keys(checkpoint["state_dict"], self.policy)
        extra = checkpoint.get("arlopti", {})
        if self.lora:
            check_base_identity(extra.get("lora_base"), self.policy.hf.arlopti_base_identity, "resume")
        self.rollout_step = int(extra.get("rollout_step", 0))
        self.weight_version = int(extra.get("weight_version", 0)) + 1  # force an engine sync
        self.guard.load_state_dict(extra)
        rng = extra.get("rng") or []
        # Applied in on_train_start, after Lightning has built the dataloader iterator (which draws
        # from torch's generator), so the first resumed step starts from the saved state exactly.
        self._pending_rng = rank_rng_state(rng, self.trainer.global_rank if self._trainer else 0, self.world)
        if rng and self._pending_rng is None:
            log.warning("checkpoint saved by %d ranks, resuming on %d: RNG states are not restored",
                        len(rng), self.world)

    def on_train_start(self) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None

    def on_train_end(self) -> None:
        """The run's config with its final metrics, for TensorBoard's HPARAMS tab (rank 0)."""
        if self.trainer.global_rank == 0 and self.last_step_context is not None:
            write_hparams(self.loggers, asdict(self.cfg), self.last_step_context.metrics,
                          self.trainer.callback_metrics, self.rollout_step)


def _prefixes(names: list[str], phase: str) -> list[str]:
    """Metric prefixes of one phase's values: the combined ``update`` and, with several phases,
    ``update/<phase>``."""
    return ["update"] if len(names) == 1 else ["update", f"update/{phase}"]
