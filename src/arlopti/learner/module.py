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
any update, so its training forward *is* ``logπ_old`` for its rows, which skip the no-grad pass.
Either way the step's inputs are one immutable :class:`~arlopti.learner.targets.Targets`, built
fresh or from the reused first forward (:mod:`arlopti.learner.targets`). Equal to the separate
pass to float rounding (tests/learner/test_forward_reuse.py); ``reuse_old_logprobs = False``
switches it off.

Micro-batches: ``sizes.micro_batch_size`` rows, or packed under ``sizes.micro_batch_tokens``
(:mod:`arlopti.learner.microbatch`).

Loss normaliser (``algorithm.token_mean_scope``): ``minibatch`` (default) divides every
micro-batch's token sum by the valid-token count of the *whole mini-batch summed over ranks*,
so a step's gradient is the exact token-mean over the mini-batch however it is split across
micro-batches and ranks (verl's global token-mean). ``microbatch`` is the official verl-0.2
behaviour: each micro-batch's own token-mean divided by the number of micro-batches, so the
update depends on the split by definition (also with a token budget, where the split follows
the lengths). The seq-mean modes count responses the same way (rows with a valid token; all
rows under SAPO's ``loss_params.sapo_empty_rows=zero``, :mod:`arlopti.algorithms.aggregation`).
Under Lopti both phases divide by *all* valid tokens (``lopti.normalize=all``,
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
by one fused finiteness reduction over the parameters (benchmarks/RESULTS.md: its cost). Finite
weights whose forward overflows (a NaN in logπ_old) stop the run before the step's update (issue 42,
:meth:`~arlopti.learner.guard.NonFiniteGuard.check_log_probs`).

Distributed (``trainer=ddp`` or ``trainer=fsdp``): each rank holds whole prompts, so whole
GRPO groups; DDP and FSDP2 average gradients over ranks, hence the ``/ world`` in the loss
normaliser above. ``configure_model`` applies FSDP2 (:mod:`arlopti.learner.sharding`) when the
strategy is a ``ModelParallelStrategy``. Every decision that changes the control flow (empty
phase, non-finite skip) is taken on all-reduced values, so the ranks never diverge.

Metrics: every algorithm logs the same core ``update/*`` tags per rollout step, combined over the
step's phases and micro-batches token-weighted; Lopti adds them per phase (``update/low/*``,
``update/high/*``). Each declares its reduction over ranks (:mod:`arlopti.learner.step_metrics`).
docs/metrics.md lists every tag.

Off-policy samples (``rollout.placement=server``): a row's ``Experience.policy_versions`` must lie
within ``rollout.async.max_staleness`` of ``rollout_step``, checked before the first optimizer step
(:mod:`arlopti.learner.async_metrics`); logπ_old is still this step's recomputation, so AR and Lopti
see p_old as on-policy, and the rollout correction weighs π_old / π_behaviour (docs/algorithms.md).

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
import warnings
from dataclasses import asdict

import lightning.pytorch as L
import torch
from torch import Tensor

from arlopti.algorithms import grpo_objective, normaliser
from arlopti.algorithms.forward_needs import first_forward_reusable, forward_stats, old_pass_stats
from arlopti.algorithms.mismatch import correction_weights
from arlopti.algorithms.rival_losses import empty_rows
from arlopti.algorithms.plan import phase_names, phase_pass_ends, step_order
from arlopti.config import RunConfig, check_rollout_correction_logprobs, validate_once
from arlopti.config.rules import effective_correction_mode
from arlopti.learner.async_metrics import add_async_metrics
from arlopti.learner.experience import Experience, experience_of, to_device, without_truncated
from arlopti.learner.guard import NonFiniteAbort, NonFiniteGuard, clip_global_norm, tensors_finite
from arlopti.learner.optim import build_optimizer
from arlopti.learner.microbatch import micro_batches_of, mini_batches
from arlopti.learner.checkpoint_state import drop_reference_weights, learner_state, load_learner_state
from arlopti.models.lora import apply_lora, lora_enabled
from arlopti.learner.sharding import shard_under_model_parallel
from arlopti.learner.policy import PolicyLM, disable_dropout, old_and_ref_log_probs
from arlopti.learner.step_context import StepContext
from arlopti.learner.step_logging import write_hparams, write_step
from arlopti.learner.metric_set import MetricSet
from arlopti.learner.step_metrics import add_objective_metrics, add_step_metrics
from arlopti.learner.targets import FirstForward, Targets, complete_targets, token_advantages
from arlopti.models.loading import load_causal_lm
from arlopti.tasks.base import trainer_placement
from arlopti.utils.precision import mixed_compute_dtype, spread_master_weights
from arlopti.utils.rng import restore_rng_state

log = logging.getLogger(__name__)

__all__ = ["GRPOModule", "NonFiniteAbort", "StepContext"]


class GRPOModule(L.LightningModule):
    """See the module docstring. ``cfg`` is a validated :class:`~arlopti.config.RunConfig`;
    ``task_options`` (the run's ``tasks`` node) are kept for the rollout callback, which
    ``arlopti.entry.train.attach_rollout_callback`` wires (the learner imports no callback)."""

    #: Take the first optimizer step's old log-probs from its own training forward (module
    #: docstring, "Forward passes"); tests switch it off to compare with the separate pass.
    reuse_old_logprobs: bool = True

    def __init__(self, cfg: RunConfig, tokenizer=None, total_rollout_steps: int | None = None,
                 log_completions: int = 2, task_options: dict | None = None, data_signature: dict | None = None):
        super().__init__()
        self.automatic_optimization = False
        validate_once(cfg)  # a no-op when train.build validated this config already (once per start)
        self.cfg = cfg
        # data_signature: the data config's identity (arlopti.entry.train.data_signature), checked on resume
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
    def _eta(self) -> float | None:
        """Lopti's threshold η, or None when Lopti is off (one phase over all tokens)."""
        return self.cfg.algorithm.lopti.eta if self.cfg.algorithm.lopti.enabled else None

    @property
    def _lora_base(self) -> dict | None:
        """A LoRA run's base-model identity (its checkpoints hold only the adapter), else None."""
        return self.policy.hf.arlopti_base_identity if self.lora else None

    @property
    def total_skips(self) -> int:
        return self.guard.total

    def setup(self, stage: str) -> None:
        validate_once(self.cfg, world_size=self.world)  # skipped when already validated for this world size
        placement = trainer_placement(self.trainer) if stage == "fit" and self._trainer is not None else None
        if placement is not None and self.cfg.model.spread_master_weights:  # the casts see small updates (issue 49)
            spread_master_weights(self.policy, mixed_compute_dtype(placement[1]))

    def configure_model(self) -> None:
        """FSDP2 under a ``ModelParallelStrategy``: shard the policy and the reference. Idempotent."""
        if self._trainer is not None:
            shard_under_model_parallel(self, self.trainer.strategy, self.cfg.model.decoder_layer_class)

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
        minis = mini_batches(len(exp), s.mini_batch_size // self.world)
        names = phase_names(self._eta, a.lopti.reverse)
        order = step_order(names, minis, a.ppo_epochs, a.lopti.granularity)
        reused = order[0][1] if self.reuse_old_logprobs and first_forward_reusable(a) else []
        # 1. old and reference log-probs (no grad); the reused first step's rows come from its own forward
        old, ref, *old_stats = old_and_ref_log_probs(self.policy, self.ref, exp, set(reused), s.logprob_micro_batch_size,
                                                     self.temperature, lora_ref=self.lora and a.kl_coef > 0,
                                                     stats=old_pass_stats(a))  # OTB's Σ p² (forward_needs)
        adv_raw = token_advantages(sampled, old, ref, exp.response_mask, a, self._sum_over_ranks, *old_stats)
        t_logp = time.perf_counter() - t0
        micro_plan = {tuple(mb): self._micro_batches(mb, exp) for mb in minis}
        metrics = MetricSet()
        if reused:
            targets, first_loss = self._reused_targets(exp, old, ref, adv_raw, order[0], micro_plan, metrics, names)
        else:
            targets, first_loss = self._targets(exp, old, ref, adv_raw), None
        # every row's logπ_old is known (the reused first step's gradients not yet applied): NaN = diverged weights
        nan = self._all_reduce(float(bool(targets.old[exp.response_mask.bool()].isnan().any())), "max") > 0
        self.guard.check_log_probs(not nan, rollout_step=self.rollout_step)
        # samples from older weights (placement=server): the staleness bound, checked before any optimizer step;
        # the flip shares over the tokens the loss sees (exp: mask_truncated leaves truncated rows out)
        add_async_metrics(metrics, exp, targets.old, self.rollout_step, self.cfg.rollout.async_.max_staleness,
                          a.lopti.eta)
        # 2. the optimizer steps, in the planned order
        for i, ((phase, mb), pass_ends) in enumerate(zip(order, phase_pass_ends(order))):
            self._update(exp, phase, mb, micro_plan[tuple(mb)], targets, metrics, _prefixes(names, phase),
                         loss=first_loss if i == 0 else None)
            if pass_ends and self.cfg.optim.scheduler_interval == "phase":
                self._step_schedule()
        # 3. metrics
        self.rollout_step += 1
        timings = {"logprobs_s": t_logp, "update_s": time.perf_counter() - t0 - t_logp, **exp.timings}
        add_step_metrics(metrics, sampled, targets, micro_plan, timings, reused=len(reused), ar_alpha=a.ar_alpha,
                         lr=float(self.optimizers().param_groups[0]["lr"]), nonfinite_skips=self.guard.total,
                         optimizer_steps=self.trainer.global_step if self._trainer else 0, eta=a.lopti.eta)
        self._finish_step(batch, sampled, targets, metrics)
        return None

    def _targets(self, exp: Experience, old: Tensor, ref: Tensor | None, adv_raw: Tensor) -> Targets:
        """The complete :class:`~arlopti.learner.targets.Targets` from every row's logπ_old: the
        fresh-forward builder, and the last act of :meth:`_reused_targets` (collective)."""
        a = self.cfg.algorithm
        return complete_targets(old, ref, adv_raw, exp.response_mask, ar_alpha=a.ar_alpha, eta=self._eta,
                                reverse=a.lopti.reverse, skip_empty=a.lopti.empty_phase == "skip",
                                sum_over_ranks=self._all_reduce)

    def _reused_targets(self, exp: Experience, old: Tensor, ref: Tensor | None, adv_raw: Tensor,
                        first: tuple[str, list[int]], micro_plan: dict, metrics: MetricSet,
                        names: list[str]) -> tuple[Targets, float]:
        """The reused-first-forward builder: accumulate the first optimizer step's gradients on
        :class:`~arlopti.learner.targets.FirstForward`, then complete the Targets. Returns them and
        that step's loss, which :meth:`_update` applies (or drops, for a phase in ``skipped``)."""
        phase, rows = first
        inputs = FirstForward(old, ref, adv_raw, self.cfg.algorithm.ar_alpha, self._eta)
        loss = self._accumulate(exp, phase, rows, micro_plan[tuple(rows)], inputs, metrics, _prefixes(names, phase))
        return self._targets(exp, old, ref, adv_raw), loss

    def _update(self, exp: Experience, phase: str, rows: list[int], micros: list[list[int]], t: Targets,
                metrics: MetricSet, prefixes: list[str], loss: float | None = None) -> None:
        """One optimizer step of ``phase`` on mini-batch ``rows``: accumulate (unless ``loss`` is given:
        the reused first step's), then apply or skip. A phase in ``t.skipped`` takes no step."""
        if phase in t.skipped:
            if loss is not None:  # the first step's own forward showed the phase empty: its gradients are zero
                self.optimizers().zero_grad(set_to_none=True)
            return
        if loss is None:
            loss = self._accumulate(exp, phase, rows, micros, t, metrics, prefixes)
        self._step_or_skip(loss, metrics, prefixes)

    def _accumulate(self, exp: Experience, phase: str, rows: list[int], micros: list[list[int]],
                    t: Targets | FirstForward, metrics: MetricSet, prefixes: list[str]) -> float:
        """Zero the gradients and back-propagate every micro-batch of mini-batch ``rows`` for
        ``phase``; returns the summed loss (the loss normaliser: the module docstring)."""
        a = self.cfg.algorithm
        self.optimizers().zero_grad(set_to_none=True)
        scale = self._loss_scale(exp, phase, rows, t)
        total = 0.0
        for micro in micros:
            sub, idx = exp.select(micro), torch.tensor(micro, device=exp.input_ids.device)
            r = sub.response_mask.shape[1]
            logp, ent, dist = self.policy(sub.input_ids, sub.attention_mask, sub.prompt_len, self.temperature,
                                          with_entropy=True, stats=forward_stats(a, self.temperature))
            old, adv, pmask = t.micro(phase, idx, r, logp, sub.response_mask)
            loss, m = grpo_objective(logp, old, adv, sub.response_mask, pmask, a,
                                     ref_log_probs=None if t.ref is None else t.ref[idx, :r], entropy=ent, scale=scale,
                                     horizon=self.cfg.rollout.max_new_tokens, normalize=a.lopti.normalize,
                                     token_weight=self._correction(old, sub), base_advantages=t.adv_raw[idx, :r],
                                     dist=dist, behaviour_log_probs=sub.engine_logprobs)
            if scale is None:
                loss = loss / len(micros)
            self.manual_backward(loss)
            total += float(loss.detach())
            add_objective_metrics(metrics, prefixes, m)
        return total

    def _loss_scale(self, exp: Experience, phase: str, rows: list[int], t: Targets | FirstForward) -> float | None:
        """The loss normaliser of mini-batch ``rows`` (module docstring; None under ``microbatch``). The
        reused first step counts valid tokens: it runs only where that is the phase's count too."""
        a = self.cfg.algorithm
        if a.token_mean_scope != "minibatch":
            return None
        idx_rows = torch.tensor(rows, device=exp.input_ids.device)
        by_phase = isinstance(t, Targets) and a.lopti.normalize != "all"
        denom = t.phases[phase].token_mask[idx_rows].float() if by_phase else exp.response_mask[idx_rows]
        return max(self._all_reduce(normaliser(denom, a.loss_agg, empty_rows(a))) / self.world, 1e-8)

    def _correction(self, old: Tensor, sub: Experience) -> Tensor | None:
        """The rollout-mismatch weight of one micro-batch (``algorithm.rollout_correction``), or None."""
        rc = self.cfg.algorithm.rollout_correction
        mode = effective_correction_mode(self.cfg.rollout, rc)  # auto: tis under bounded staleness k > 0
        if mode == "none":
            return None
        check_rollout_correction_logprobs(mode, sub.engine_logprobs is not None)
        return correction_weights(old, sub.engine_logprobs, sub.response_mask, mode, cap=rc.cap,
                                  mis_low=rc.mis_low, mis_high=rc.mis_high)

    def _step_or_skip(self, loss: float, metrics: MetricSet, prefixes: list[str]) -> None:
        """Clip by the global norm and step, or skip a non-finite step (decided over all ranks)."""
        grad_norm = clip_global_norm(list(self.policy.parameters()), self.cfg.optim.grad_clip)
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
            self._step_schedule()
        self.weight_version += 1
        for prefix in prefixes:
            metrics.add(f"{prefix}/grad_norm", grad_norm)
            metrics.add(f"{prefix}/steps", 1.0, "sum")

    def _step_schedule(self) -> None:
        """Advance the LR schedule. Under ``scheduler_interval=phase`` it counts phase passes (verl
        steps it once per ``update_actor`` call), and a pass whose steps were all skipped (an empty
        phase under ``empty_phase=skip``, or non-finite) took no optimizer step: when that is the
        run's first pass torch warns "lr_scheduler.step() before optimizer.step()". Advancing is
        intended there, so exactly that warning is silenced, here and nowhere else."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.lr_schedulers().step()

    def _check_weights(self, *, lr: float, loss: float, grad_norm: float) -> None:
        """After an optimizer step: are the updated parameters finite on every rank? (One fused
        reduction over this rank's parameters, :func:`~arlopti.learner.guard.tensors_finite`; one
        scalar all-reduce when distributed.) If not, abort before anything can checkpoint them."""
        finite = bool(tensors_finite(p for p in self.policy.parameters() if p.requires_grad))
        if self.world > 1:
            finite = self._all_reduce(0.0 if finite else 1.0, "max") == 0
        self.guard.check_weights(finite, rollout_step=self.rollout_step, lr=lr, loss=loss, grad_norm=grad_norm)

    # ------------------------------------------------------------------ metrics
    def _finish_step(self, batch, exp: Experience, t: Targets, metrics: MetricSet) -> None:
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
                                              self.world, self._lora_base)
        drop_reference_weights(self, checkpoint.get("state_dict", {}), "", None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Counters, guard and RNG state. The RNG state is applied in on_train_start, after Lightning
        has built the dataloader iterator (which draws from torch's generator), so the first resumed
        step starts from the saved state exactly."""
        rank = self.trainer.global_rank if self._trainer else 0
        self.rollout_step, version, self._pending_rng = load_learner_state(checkpoint, self.policy, self.guard, rank,
                                                                           self.world, self._lora_base)
        self.weight_version = version + 1  # force an engine sync

    def on_before_optimizer_step(self, optimizer) -> None:
        """Before this process's first optimizer step: warn when it would move the weights by more than
        their own norm (:meth:`~arlopti.learner.guard.NonFiniteGuard.check_first_step`)."""
        self.guard.check_first_step(optimizer, self.rollout_step)

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
