"""``GRPOModule``: the learner. GRPO, Advantage Reweighting and Lopti with manual optimisation.

One ``training_step`` is one rollout step (docs/learner.md says it in prose, docs/architecture.md places it):

1. ``logπ_old`` and the reference log-probs (no grad; :mod:`~arlopti.learner.policy`), then the token
   advantages (:mod:`~arlopti.learner.advantages`);
2. each token's inputs, AR and its Lopti phase (:mod:`arlopti.algorithms.inputs`); the first optimizer
   step may take its rows' ``logπ_old`` from its own forward (:class:`~arlopti.algorithms.inputs.FirstStepInputs`);
3. the optimizer steps in the plan's order (:mod:`arlopti.algorithms.plan`): each accumulates
   :func:`~arlopti.algorithms.grpo_objective` over its micro-batches, then clips and steps
   (:mod:`~arlopti.learner.optimizer_step`);
4. the step's metrics (:mod:`~arlopti.learner.step_metrics`).

The options above the paper (rival losses, token methods, rollout correction, …) reach the step through
one seam, :class:`~arlopti.plugins.run_options.RunOptions`: what the forwards return, and one
:class:`~arlopti.algorithms.objective.Shaping` per micro-batch.
"""

import logging
import time
from dataclasses import asdict

import lightning.pytorch as L
import torch

from arlopti.algorithms import LossScale, grpo_objective
from arlopti.algorithms.inputs import FirstStepInputs, StepInputs, step_inputs
from arlopti.algorithms.plan import phase_names, phase_pass_ends, step_order
from arlopti.config import RunConfig, validate_once
from arlopti.learner.advantages import token_advantages
from arlopti.learner.async_metrics import add_async_metrics
from arlopti.learner.checkpoint_state import drop_reference_weights
from arlopti.learner.experience import Experience, experience_of, to_device, without_truncated
from arlopti.learner.guard import NonFiniteAbort, NonFiniteGuard
from arlopti.learner.lifecycle import RunLifecycleMixin
from arlopti.learner.metric_set import MetricSet
from arlopti.learner.microbatch import micro_batches_of, mini_batches
from arlopti.learner.optimizer_step import OptimizerStepMixin
from arlopti.learner.policy import PolicyLM, disable_dropout, old_and_ref_log_probs
from arlopti.learner.step_context import StepContext
from arlopti.learner.step_metrics import add_objective_metrics, add_step_metrics
from arlopti.models.loading import load_causal_lm
from arlopti.models.lora import apply_lora, lora_enabled
from arlopti.plugins.run_options import RunOptions

log = logging.getLogger(__name__)

__all__ = ["GRPOModule", "NonFiniteAbort", "StepContext"]


class GRPOModule(OptimizerStepMixin, RunLifecycleMixin, L.LightningModule):
    """See the module docstring. ``cfg`` is a validated :class:`~arlopti.config.RunConfig`;
    ``task_options`` (the run's ``tasks`` node) are kept for the rollout callback, which
    ``arlopti.entry.train.attach_rollout_callback`` wires (the learner imports no callback)."""

    #: Take the first optimizer step's old log-probs from its own training forward (docs/learner.md,
    #: "Forward passes"); tests switch it off to compare with the separate pass.
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
        self.options = RunOptions(cfg.algorithm, cfg.rollout)  # the seam to everything beyond the paper
        self.lopti_eta = cfg.algorithm.lopti.eta if cfg.algorithm.lopti.enabled else None  # None: one phase
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
    def total_skips(self) -> int:
        return self.guard.total

    def _micro_batches(self, rows: list[int], experience: Experience) -> list[list[int]]:
        """Micro-batches of mini-batch ``rows`` (:func:`~arlopti.learner.microbatch.micro_batches_of`);
        with a token budget their count is the max over ranks (each backward is a collective)."""
        s = self.cfg.sizes
        rows_mb, oversized = micro_batches_of(rows, experience, s.micro_batch_size, s.micro_batch_tokens,
                                              lambda k: int(self._all_reduce(k, "max")))
        if oversized and not self._warned_oversized:
            self._warned_oversized = True
            log.warning("%s (warned once)", oversized)
        return rows_mb

    # ------------------------------------------------------------------ the step
    def training_step(self, batch, batch_idx: int):
        sampled = to_device(experience_of(batch), self.device)
        a, s = self.cfg.algorithm, self.cfg.sizes
        experience = without_truncated(sampled) if a.dapo.mask_truncated else sampled  # what the loss sees
        t0 = time.perf_counter()
        minis = mini_batches(len(experience), s.mini_batch_size // self.world)
        names = phase_names(self.lopti_eta, a.lopti.reverse)
        order = step_order(names, minis, a.ppo_epochs, a.lopti.granularity)
        reused = order[0][1] if self._first_step_reusable() else []
        # 1. old and reference log-probs (no grad); the reused first step's rows come from its own forward
        old, ref, *old_stats = old_and_ref_log_probs(
            self.policy, self.ref, experience, set(reused), s.logprob_micro_batch_size, self.temperature,
            lora_ref=self.lora and a.kl_coef > 0, stats=self.options.old_pass_stats)
        adv_raw = token_advantages(sampled, old, ref, experience.response_mask, a, self._sum_over_ranks, *old_stats)
        t_logp = time.perf_counter() - t0
        micro_plan = {tuple(mb): self._micro_batches(mb, experience) for mb in minis}
        metrics = MetricSet()
        first_loss = None
        if reused:  # the first step accumulates on its own forward's logπ_old, filling ``old``'s rows
            phase, rows = order[0]
            first = FirstStepInputs(old, ref, adv_raw, a.ar_alpha, self.lopti_eta)
            first_loss = self._accumulate(experience, phase, rows, micro_plan[tuple(rows)], first, metrics,
                                          _prefixes(names, phase))
        inputs = step_inputs(old, ref, adv_raw, experience.response_mask, ar_alpha=a.ar_alpha, eta=self.lopti_eta,
                             reverse=a.lopti.reverse, skip_empty=a.lopti.empty_phase == "skip",
                             sum_over_ranks=self._all_reduce)  # every row's logπ_old is known now (collective)
        nan = self._all_reduce(float(bool(inputs.old[experience.response_mask.bool()].isnan().any())), "max") > 0
        self.guard.check_log_probs(not nan, rollout_step=self.rollout_step)  # NaN: diverged weights
        # samples from older weights (placement=server): the staleness bound, before any optimizer step
        add_async_metrics(metrics, experience, inputs.old, self.rollout_step,
                          self.cfg.rollout.async_.max_staleness, a.low_prob_threshold)
        # 2. the optimizer steps, in the planned order
        for i, ((phase, mb), pass_ends) in enumerate(zip(order, phase_pass_ends(order))):
            self._update(experience, phase, mb, micro_plan[tuple(mb)], inputs, metrics, _prefixes(names, phase),
                         loss=first_loss if i == 0 else None)
            if pass_ends and self.cfg.optim.scheduler_interval == "phase":
                self._step_schedule()
        # 3. metrics
        self.rollout_step += 1
        timings = {"logprobs_s": t_logp, "update_s": time.perf_counter() - t0 - t_logp, **experience.timings}
        add_step_metrics(metrics, sampled, inputs, micro_plan, timings, reused=len(reused), ar_alpha=a.ar_alpha,
                         lr=float(self.optimizers().param_groups[0]["lr"]), nonfinite_skips=self.guard.total,
                         optimizer_steps=self.trainer.global_step if self._trainer else 0,
                         low_prob_threshold=a.low_prob_threshold)
        self._finish_step(batch, sampled, inputs, metrics)
        return None

    def _first_step_reusable(self) -> bool:
        """May the first optimizer step take its rows' logπ_old from its own forward? Not when the advantages
        read every token's logπ_old before any backward (KL in the reward, OTB), nor under
        ``lopti.normalize=phase``, whose denominator counts the phase's tokens before the first backward."""
        lopti = self.cfg.algorithm.lopti
        return self.reuse_old_logprobs and not self.options.needs_old_before_update \
            and not (lopti.enabled and lopti.normalize == "phase")

    def _update(self, experience: Experience, phase: str, rows: list[int], micros: list[list[int]],
                inputs: StepInputs, metrics: MetricSet, prefixes: list[str], loss: float | None = None) -> None:
        """One optimizer step of ``phase`` on mini-batch ``rows``: accumulate (unless ``loss`` is given:
        the reused first step's), then apply or skip. A phase in ``inputs.skipped`` takes no step."""
        if phase in inputs.skipped:
            if loss is not None:  # the first step's own forward showed the phase empty: its gradients are zero
                self.optimizers().zero_grad(set_to_none=True)
            return
        if loss is None:
            loss = self._accumulate(experience, phase, rows, micros, inputs, metrics, prefixes)
        self._step_or_skip(loss, metrics, prefixes)

    def _accumulate(self, experience: Experience, phase: str, rows: list[int], micros: list[list[int]],
                    inputs: StepInputs | FirstStepInputs, metrics: MetricSet, prefixes: list[str]) -> float:
        """Zero the gradients and back-propagate every micro-batch of mini-batch ``rows`` for
        ``phase``; returns the summed loss (the loss normaliser: docs/learner.md)."""
        a, opts = self.cfg.algorithm, self.options
        self.optimizers().zero_grad(set_to_none=True)
        scale = LossScale(self._loss_count(experience, phase, rows, inputs), self.cfg.rollout.max_new_tokens)
        total = 0.0
        for micro in micros:
            sub, idx = experience.select(micro), torch.tensor(micro, device=experience.input_ids.device)
            r, mask = sub.response_mask.shape[1], sub.response_mask
            logp, ent, stats = self.policy(sub.input_ids, sub.attention_mask, sub.prompt_len, self.temperature,
                                          with_entropy=True, stats=opts.forward_stats)
            old, adv, pmask = inputs.micro(phase, idx, r, logp, mask)
            shaping = opts.shaping(logp, old, adv, sub, pmask, ent, stats)
            ref = None if inputs.ref is None else inputs.ref[idx, :r]
            loss, m = grpo_objective(logp, old, adv, mask, pmask, a, ref, ent, scale, shaping)
            m.update(opts.effective_weights(adv, shaping, inputs.base_advantages[idx, :r], old, pmask))
            if scale.value is None:
                loss = loss / len(micros)
            self.manual_backward(loss)
            total += float(loss.detach())
            add_objective_metrics(metrics, prefixes, m)
        return total

    def _loss_count(self, experience: Experience, phase: str, rows: list[int],
                    inputs: StepInputs | FirstStepInputs) -> float | None:
        """The loss normaliser of mini-batch ``rows`` (docs/learner.md; None under ``microbatch``). The
        reused first step counts valid tokens: it runs only where that is the phase's count too."""
        a = self.cfg.algorithm
        if a.token_mean_scope != "minibatch":
            return None
        idx_rows = torch.tensor(rows, device=experience.input_ids.device)
        by_phase = isinstance(inputs, StepInputs) and a.lopti.normalize != "all"
        denom = inputs.phases[phase].token_mask[idx_rows].float() if by_phase \
            else experience.response_mask[idx_rows]
        return max(self._all_reduce(self.options.loss_count(denom, a.loss_agg)) / self.world, 1e-8)


def _prefixes(names: list[str], phase: str) -> list[str]:
    """Metric prefixes of one phase's values: the combined ``update`` and, with several phases,
    ``update/<phase>``."""
    return ["update"] if len(names) == 1 else ["update", f"update/{phase}"]
