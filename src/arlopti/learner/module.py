"""``GRPOModule``: the learner. GRPO, Advantage Reweighting and Lopti with manual optimisation.

One ``training_step`` consumes one rollout step (the :class:`Experience` the rollout callback
attached to the batch) and does exactly this:

1. old log-probs ``logπ_old`` of the sampled tokens with the current weights (no grad, at the
   rollout temperature T) and, when β > 0, reference log-probs from the frozen initial policy;
2. advantages: the configured estimator (``grpo`` by default) per response, broadcast to its
   tokens; then AR, ``A ← (α·p_old + 1 − α)·A``, once, before any update;
3. the phase plan: GRPO has one phase (all tokens); Lopti has ``[low, high]`` split at
   ``p_old < η`` (``reverse`` swaps them);
4. optimizer steps. ``granularity=batch`` (official): for each phase, a full pass over all
   mini-batches → steps ``[low mb1 … low mbK, high mb1 … high mbK]``. ``granularity=minibatch``:
   ``[low mb1, high mb1, low mb2, …]``. Each step: zero grads, accumulate micro-batch
   gradients (``manual_backward``), clip by global norm, ``opt.step()``, scheduler step.
   ``ppo_epochs`` repeats the whole plan.

Forward passes (none wasted). The no-grad passes of step 1 go through the rows longest response
first, ``sizes.logprob_micro_batch_size`` rows at a time, each chunk trimmed to its longest
response; they run inside ``training_step``, i.e. under Lightning's precision context (bf16
autocast with ``trainer.precision=bf16-mixed``). β = 0 builds no reference model and runs no
reference pass. The first optimizer step of the plan (phase 1, mini-batch 1) runs before any
update, so the policy's training forward on its rows *is* ``logπ_old`` there: those rows skip
the no-grad policy pass, and their ``logπ_old`` (detached), AR weights and phase mask are
computed micro-batch by micro-batch from that forward (all three are per-token functions of
``p_old``); whether that first phase is empty over all ranks is decided after its backwards (its
loss is then identically zero and no step is taken). With a single mini-batch the separate
old-log-prob pass disappears. The result equals the separate pass to float rounding (ratio
exactly 1 instead of 1 ± 1e-7). Not done under ``lopti.normalize=phase``, whose normaliser
needs every ``p_old`` of the mini-batch before the first backward; ``reuse_old_logprobs = False``
switches it off.

Micro-batches: ``sizes.micro_batch_size`` rows at a time, or, with ``sizes.micro_batch_tokens``
set, rows packed under that padded-token budget (:mod:`arlopti.learner.microbatch`: longest
first, the fewest micro-batches that fit, the most even split; the count is the max over
ranks). ``update/valid_token_frac`` logs real / padded tokens of the training forwards.

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

Distributed (``trainer=ddp`` or ``trainer=fsdp``): each rank holds whole prompts, so whole
GRPO groups; DDP and FSDP2 average gradients over ranks, hence the ``/ world`` in the loss
normaliser above. ``configure_model`` applies FSDP2 (:mod:`arlopti.learner.sharding`) when the
strategy is a ``ModelParallelStrategy``. Every decision that changes the control flow (empty
phase, non-finite skip) is taken on all-reduced values, so the ranks never diverge.
Gradient clipping uses the global norm (DTensor gradients under FSDP2, already-averaged
gradients under DDP).

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

import functools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass

import lightning.pytorch as L
import torch
from torch import Tensor

from arlopti.algorithms import (ADVANTAGE_ESTIMATORS, LossConfig, Phase, advantage_reweight, ar_weights,
                                broadcast_to_tokens, grpo_objective, lopti_masks, normaliser, phase_plan,
                                zero_std_group_fraction)
from arlopti.config import LR_SCHEDULES, RunConfig, validate_run
from arlopti.learner.experience import Experience
from arlopti.learner.microbatch import fixed_micro_batches, micro_batch_cost, min_micro_batches, plan_micro_batches
from arlopti.learner.policy import PolicyLM, disable_dropout
from arlopti.models import TinySpec, load_causal_lm
from arlopti.utils.rng import capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)

# Metrics combined over ranks by sum (counts, throughput) or max (maxima, wall times); the rest by mean.
_SUM_METRICS = ("rollout/responses", "rollout/tokens", "timing/tokens_per_s")
_SUM_SUFFIXES = ("_tokens", "/tokens")
_MAX_SUFFIXES = ("_max", "_s")


@dataclass
class StepContext:
    """What one training step computed, for diagnostics callbacks (read in on_train_batch_end)."""

    experience: Experience
    old_log_probs: Tensor  # [B, R]
    advantages_raw: Tensor  # [B, R] before AR
    advantages: Tensor  # [B, R] after AR
    phases: list[Phase]
    metrics: dict[str, float]


class NonFiniteAbort(RuntimeError):
    pass


@dataclass
class _FirstStep:
    """What the reused first optimizer step needs to build ``logπ_old``, AR and its phase mask."""

    adv_raw: Tensor  # [B, R] advantages before AR
    eta: float | None  # Lopti threshold, None = one phase
    on_filled: "Callable[[], bool]"  # called once old_logp is complete; True = phase empty everywhere

    def resolve(self, logp: Tensor, response_mask: Tensor, adv_raw: Tensor, phase: str,
                alpha: float) -> tuple[Tensor, Tensor, Tensor]:
        """``(old [b, r], advantages [b, r], phase mask [b, r])`` of one micro-batch from its forward.

        Element for element what the separate pass would give with these log-probs: ``old`` =
        detached log-probs × mask, AR ``(α·p_old + 1 − α)·A``, and the phase's tokens
        (``lopti_masks``: ``p_old < η`` for low).
        """
        old = logp.detach() * response_mask
        adv = advantage_reweight(adv_raw, old, alpha) if alpha > 0 else adv_raw
        if phase == "all":
            pmask = response_mask.bool()
        else:
            low, high = lopti_masks(old, response_mask, self.eta)
            pmask = low if phase == "low" else high
        return old, adv, pmask


class GRPOModule(L.LightningModule):
    """See the module docstring. ``cfg`` is a validated :class:`~arlopti.config.RunConfig`."""

    #: Take the first optimizer step's old log-probs from its own training forward (module
    #: docstring, "Forward passes"); tests switch it off to compare with the separate pass.
    reuse_old_logprobs: bool = True

    def __init__(self, cfg: RunConfig, tokenizer=None, total_rollout_steps: int | None = None,
                 log_completions: int = 2):
        super().__init__()
        self.automatic_optimization = False
        validate_run(cfg)
        self.cfg = cfg
        self.save_hyperparameters({"run": asdict(cfg)})
        self.tokenizer = tokenizer
        self.total_rollout_steps = total_rollout_steps
        self.log_completions = log_completions
        self.policy = PolicyLM(self._load_model(cfg.model.dtype), cfg.model.logprob_impl)
        self.ref: PolicyLM | None = None
        if cfg.algorithm.kl_coef > 0:  # β = 0 loads no reference model
            self.ref = PolicyLM(self._load_model(cfg.model.ref_dtype or cfg.model.dtype), cfg.model.logprob_impl)
            self.ref.requires_grad_(False)
            self.ref.eval()
        if cfg.model.gradient_checkpointing:
            self.policy.hf.gradient_checkpointing_enable()
        self.loss_cfg = LossConfig(
            clip_low=cfg.algorithm.clip_low, clip_high=cfg.algorithm.clip_high,
            dual_clip=cfg.algorithm.dual_clip, agg=cfg.algorithm.loss_agg, kl_coef=cfg.algorithm.kl_coef,
            kl_estimator=cfg.algorithm.kl_estimator, entropy_coef=cfg.algorithm.entropy_coef)
        self.rollout_step = 0
        self.weight_version = 0
        self.consecutive_skips = 0
        self.total_skips = 0
        self.last_step_context: StepContext | None = None
        # The reference model is rebuilt from the config, never saved: its weights are dropped from
        # every state_dict (so that distributed checkpoints do not expect them back) and loading is
        # not strict; on_load_checkpoint checks the policy's keys itself.
        self.strict_loading = False
        self.register_state_dict_post_hook(_drop_reference_weights)
        self._pending_rng: dict | None = None
        self._warned_oversized = False

    # ------------------------------------------------------------------ set-up
    def _load_model(self, dtype: str):
        m = self.cfg.model
        t = m.tiny
        spec = TinySpec(arch=t.arch, hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                        num_kv_heads=t.num_kv_heads, intermediate_size=t.intermediate_size,
                        tie_word_embeddings=t.tie_word_embeddings, seed=t.seed)
        model = load_causal_lm(m.name_or_path, self.tokenizer, dtype=dtype, tiny=spec)
        disable_dropout(model)
        return model

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature

    @property
    def world(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def setup(self, stage: str) -> None:
        validate_run(self.cfg, world_size=self.world)

    def configure_model(self) -> None:
        """FSDP2 under a ``ModelParallelStrategy``: shard the policy and the reference. Idempotent."""
        if self._trainer is None:
            return
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = self.trainer.strategy
        if not isinstance(strategy, ModelParallelStrategy):
            return
        from arlopti.learner.sharding import FSDPOptions, ShardingError, apply_fsdp2

        mesh = self.device_mesh
        if mesh["tensor_parallel"].size() != 1:
            raise ShardingError(f"tensor_parallel_size={mesh['tensor_parallel'].size()}: arlopti shards data-parallel "
                                "only; use trainer=fsdp (tensor_parallel_size=1)")
        options = getattr(strategy, "fsdp_options", None) or FSDPOptions()
        dp = mesh["data_parallel"]
        apply_fsdp2(self.policy, dp, options, self.cfg.model.decoder_layer_class)
        if self.ref is not None:
            ref_options = FSDPOptions(mixed_precision=options.mixed_precision, reduce_dtype=options.reduce_dtype,
                                      cpu_offload=options.cpu_offload)
            apply_fsdp2(self.ref, dp, ref_options, self.cfg.model.decoder_layer_class)

    def configure_optimizers(self):
        o = self.cfg.optim
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if o.name == "adamw":
            opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        else:
            opt = torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        # optim.lr_schedule / optim.scheduler_interval: ours, or the official verl schedule (config.py)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, functools.partial(LR_SCHEDULES[o.lr_schedule], warmup=o.warmup_steps))
        return [opt], [{"scheduler": sched, "interval": "step"}]

    # ------------------------------------------------------------------ helpers
    def _all_sum(self, value: float) -> float:
        """Sum a scalar over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return float(value)
        t = torch.tensor(float(value), device=self.device, dtype=torch.float64)
        return float(self.trainer.strategy.reduce(t, reduce_op="sum"))

    def _all_max(self, value: float) -> float:
        """Max of a scalar over data-parallel ranks (identity on one process)."""
        if self.world == 1:
            return float(value)
        t = torch.tensor(float(value), device=self.device, dtype=torch.float64)
        return float(self.trainer.strategy.reduce(t, reduce_op="max"))

    def _micro_batches(self, rows: list[int], exp: Experience | None = None) -> list[list[int]]:
        """Row lists of the micro-batches of mini-batch ``rows`` (indices into ``exp``).

        ``sizes.micro_batch_tokens`` unset: ``sizes.micro_batch_size`` rows at a time, in order.
        Set: :func:`~arlopti.learner.microbatch.plan_micro_batches` on the rows' response
        lengths, with the number of micro-batches raised to the max over ranks (every rank must
        run as many backwards: each is a gradient collective). Collective when ``world > 1``.
        """
        s = self.cfg.sizes
        if s.micro_batch_tokens is None or exp is None:
            return [[rows[j] for j in mb] for mb in fixed_micro_batches(len(rows), s.micro_batch_size)]
        lengths = [int(x) for x in exp.response_mask[rows].sum(-1).tolist()]
        k = int(self._all_max(min_micro_batches(lengths, exp.prompt_len, s.micro_batch_tokens)))
        plan = plan_micro_batches(lengths, exp.prompt_len, s.micro_batch_tokens, k=k)
        if plan.oversized and not self._warned_oversized:
            self._warned_oversized = True
            longest = max(lengths[i] for i in plan.oversized)
            log.warning("sizes.micro_batch_tokens=%d is below the cost of %d single sequence(s) (prompt %d + "
                        "response up to %d tokens): each gets a micro-batch of its own. Raise the budget to "
                        "at least %d to bound the memory of every micro-batch (warned once).",
                        s.micro_batch_tokens, len(plan.oversized), exp.prompt_len, longest,
                        exp.prompt_len + longest)
        return [[rows[j] for j in mb] for mb in plan.micro_batches]

    def _plan_micro_batches(self, exp: Experience, minis: list[list[int]]) -> dict[tuple[int, ...], list[list[int]]]:
        """Micro-batches of every mini-batch of this step, planned once (the plan depends only on
        the rows, not on the phase or epoch), in mini-batch order on every rank."""
        return {tuple(mb): self._micro_batches(mb, exp) for mb in minis}

    def _no_grad_logprobs(self, model: PolicyLM, exp: Experience, rows: list[int], out: Tensor) -> None:
        """Fill ``out[rows]`` with ``model``'s log-probs (no grad, rollout temperature).

        Rows go longest response first in chunks of ``sizes.logprob_micro_batch_size``, each
        trimmed to its longest response (less padding than chunks in row order); positions past
        a row's chunk width keep ``out``'s zeros. Runs under the caller's precision context
        (Lightning's autocast inside ``training_step``). The chunk count depends only on
        ``len(rows)``, which is equal on every rank (collective forwards under FSDP2).
        """
        if not rows:
            return
        n = self.cfg.sizes.logprob_micro_batch_size
        lengths = exp.response_mask[rows].sum(-1).tolist()
        order = [rows[i] for i in sorted(range(len(rows)), key=lambda i: (-lengths[i], i))]
        with torch.no_grad():
            for lo in range(0, len(order), n):
                chunk = order[lo:lo + n]
                sub = exp.select(chunk)
                logp, _ = model(sub.input_ids, sub.attention_mask, sub.prompt_len, self.temperature,
                                with_entropy=False)
                idx = torch.tensor(chunk, device=out.device)
                out[idx, :logp.shape[1]] = logp.to(out.dtype)

    def _reuses_first_forward(self) -> bool:
        """Whether the first optimizer step takes its rows' old log-probs from its own forward.

        Exact: before the first step the policy *is* the rollout policy, so its training forward
        gives ``logπ_old`` for those rows (detached), and AR and the Lopti split are per-token
        functions of ``p_old`` that can be evaluated micro-batch by micro-batch. Not with
        ``lopti.normalize=phase``: its loss denominator is the phase's token count over the whole
        mini-batch, needed before the first micro-batch's backward.
        """
        lo = self.cfg.algorithm.lopti
        return self.reuse_old_logprobs and not (lo.enabled and lo.normalize == "phase")

    def _clip_and_norm(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.optim.grad_clip
        if not params:
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------ the step
    def training_step(self, batch, batch_idx: int):
        exp: Experience | None = getattr(batch, "experience", None)
        if exp is None:
            raise RuntimeError("the batch carries no experience: add arlopti.rollout.RolloutCallback to the "
                               "trainer callbacks (callbacks=default does)")
        exp = _to_device(exp, self.device)
        a, s = self.cfg.algorithm, self.cfg.sizes
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()

        # 1. old and reference log-probs, once per step, before any update (no grad). The first
        # optimizer step's rows skip the policy pass when their training forward can supply them.
        per_rank_mini = s.mini_batch_size // self.world
        rows = list(range(len(exp)))
        minis = [rows[i:i + per_rank_mini] for i in range(0, len(rows), per_rank_mini)]
        reuse = self._reuses_first_forward()
        first_rows = set(minis[0]) if reuse else set()
        mask = exp.response_mask
        old_logp = torch.zeros_like(mask)
        was_training = self.policy.training
        self.policy.eval()
        self._no_grad_logprobs(self.policy, exp, [i for i in rows if i not in first_rows], old_logp)
        ref_logp = None
        if self.ref is not None:
            ref_logp = torch.zeros_like(mask)
            self._no_grad_logprobs(self.ref, exp, rows, ref_logp)
        self.policy.train(was_training)
        old_logp = old_logp * mask  # padding: logp 0 (p = 1), never used
        t_logp = time.perf_counter() - t0

        # 2. advantages (AR needs p_old: for the reused rows it is applied inside the first step)
        adv_seq = ADVANTAGE_ESTIMATORS.get(a.advantage)(exp.rewards, exp.group_ids, eps=a.adv_eps)
        adv_raw = broadcast_to_tokens(adv_seq.to(mask.device), mask)
        eta = a.lopti.eta if a.lopti.enabled else None

        def finish_old() -> tuple[Tensor, list[Phase], dict[str, bool]]:
            """AR, phase plan and empty phases, once old_logp is complete."""
            adv_ = advantage_reweight(adv_raw, old_logp, a.ar_alpha) if a.ar_alpha > 0 else adv_raw
            phases_ = phase_plan(mask, old_logp, eta, a.lopti.reverse)
            empty_ = {ph.name: self._all_sum(float(ph.token_mask.sum())) == 0 for ph in phases_}
            return adv_, phases_, empty_

        # 3. phases and 4. optimizer steps. Plan order: per epoch, per phase all mini-batches
        # (granularity=batch) or per mini-batch all phases (granularity=minibatch).
        t1 = time.perf_counter()
        names = ["all"] if eta is None else (["high", "low"] if a.lopti.reverse else ["low", "high"])
        order: list[tuple[str, list[int]]] = []
        for _ in range(a.ppo_epochs):
            if a.lopti.granularity == "batch" or len(names) == 1:
                order += [(n, mb) for n in names for mb in minis]
            else:
                order += [(n, mb) for mb in minis for n in names]
        micro_plan = self._plan_micro_batches(exp, minis)
        phase_stats: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        adv = phases = empty = None
        start = 0
        if reuse:
            # The first step fills old_logp (and AR-weighted advantages) for its rows from its own
            # forward; its phase mask is evaluated per micro-batch from those values.
            adv_first = adv_raw.clone()
            name0, mb0 = order[0]
            resolved: dict = {}

            def on_filled() -> bool:
                resolved["v"] = finish_old()
                return resolved["v"][2][name0]  # True: phase empty on every rank -> no step

            first = _FirstStep(adv_raw=adv_raw, eta=eta, on_filled=on_filled)
            self._optimizer_step(exp, mb0, Phase(name0, mask.bool()), old_logp, ref_logp, adv_first,
                                 phase_stats[name0], micro_batches=micro_plan[tuple(mb0)], first=first)
            adv, phases, empty = resolved["v"]
            start = 1
            self._end_of_phase_pass(order, 0)
        else:
            adv, phases, empty = finish_old()
        by_name = {ph.name: ph for ph in phases}
        skip_empty = a.lopti.empty_phase == "skip"
        for i in range(start, len(order)):
            name, mb = order[i]
            if not (empty[name] and skip_empty):
                self._optimizer_step(exp, mb, by_name[name], old_logp, ref_logp, adv, phase_stats[name],
                                     micro_batches=micro_plan[tuple(mb)])
            self._end_of_phase_pass(order, i)
        t_update = time.perf_counter() - t1

        # 5. bookkeeping and metrics
        self.rollout_step += 1
        for ph in phases:
            stats = phase_stats.get(ph.name, {})
            prefix = f"update/{ph.name}"
            metrics[f"{prefix}/skipped_empty"] = float(empty[ph.name] and skip_empty)
            for k, v in stats.items():
                metrics[f"{prefix}/{k}"] = float(sum(v) / len(v))
        metrics.update(self._rollout_metrics(exp, old_logp, adv_raw, adv, phases))
        metrics.update(self._padding_metrics(exp, micro_plan))
        metrics["update/old_logprobs_reused_frac"] = len(first_rows) / max(1, len(rows))
        metrics["timing/logprobs_s"] = t_logp
        metrics["timing/update_s"] = t_update
        for k, v in exp.timings.items():
            metrics[f"timing/{k}"] = v
        n_tokens = float(mask.sum())
        total_t = t_logp + t_update + sum(exp.timings.values())
        metrics["timing/tokens_per_s"] = n_tokens / total_t if total_t > 0 else 0.0
        metrics["update/lr"] = float(self.optimizers().param_groups[0]["lr"])
        metrics["update/nonfinite_skips"] = float(self.total_skips)
        metrics["update/optimizer_steps"] = float(self.trainer.global_step) if self._trainer else 0.0
        metrics = self._reduce_metrics(metrics)
        self.last_step_context = StepContext(exp, old_logp, adv_raw, adv, phases, metrics)
        self._log_step(metrics, exp, old_logp)
        if self._trainer is not None:
            dm = getattr(self.trainer, "datamodule", None)
            if dm is not None and hasattr(dm, "mark_consumed"):
                dm.mark_consumed(batch)
            if self.total_rollout_steps is not None and self.rollout_step >= self.total_rollout_steps:
                self.trainer.should_stop = True
        return None

    def _optimizer_step(self, exp: Experience, rows: list[int], phase: Phase, old_logp: Tensor,
                        ref_logp: Tensor | None, adv: Tensor, stats: dict[str, list[float]],
                        micro_batches: list[list[int]] | None = None, first: "_FirstStep | None" = None) -> None:
        """One optimizer step on mini-batch ``rows`` for ``phase`` (accumulated over micro-batches).

        ``first`` (the reused first step, see :meth:`_reuses_first_forward`): each micro-batch's
        detached log-probs are written into ``old_logp`` and its AR-weighted advantages into
        ``adv``, the phase mask is computed from them, and after the last backward
        ``first.on_filled()`` says whether the phase is empty on every rank (then no step).
        """
        a = self.cfg.algorithm
        opt = self.optimizers()
        sched = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        rows_t = torch.tensor(rows, device=exp.input_ids.device)
        if first is None and a.lopti.normalize != "all":
            denom_mask = phase.token_mask[rows_t].float()
        else:  # normalize=all (or the reused first step, which requires it)
            denom_mask = exp.response_mask[rows_t]
        micros = micro_batches if micro_batches is not None else self._micro_batches(rows, exp)
        if a.token_mean_scope == "minibatch":
            # Each rank's gradient is averaged over ranks by DDP/FSDP, hence the / world.
            scale = self._all_sum(normaliser(denom_mask, a.loss_agg)) / self.world
            scale = max(scale, 1e-8)
        else:
            scale = None
        step_metrics: dict[str, list[float]] = defaultdict(list)
        loss_total = 0.0
        for micro in micros:
            sub = exp.select(micro)
            idx = torch.tensor(micro, device=exp.input_ids.device)
            r = sub.response_mask.shape[1]
            logp, ent = self.policy(sub.input_ids, sub.attention_mask, sub.prompt_len, self.temperature,
                                    with_entropy=True)
            if first is None:
                old_mb, adv_mb, phase_mb = old_logp[idx, :r], adv[idx, :r], phase.token_mask[idx, :r]
            else:
                old_mb, adv_mb, phase_mb = first.resolve(logp, sub.response_mask, first.adv_raw[idx, :r],
                                                         phase.name, a.ar_alpha)
                old_logp[idx, :r] = old_mb
                adv[idx, :r] = adv_mb
            loss, m = grpo_objective(
                logp, old_mb, adv_mb, sub.response_mask, phase_mb, self.loss_cfg,
                ref_log_probs=None if ref_logp is None else ref_logp[idx, :r], entropy=ent, scale=scale,
                horizon=self.cfg.rollout.max_new_tokens, normalize=a.lopti.normalize)
            if scale is None:
                loss = loss / len(micros)
            self.manual_backward(loss)
            loss_total += float(loss.detach())
            for k, v in m.items():
                step_metrics[k].append(v)
        if first is not None and first.on_filled() and a.lopti.empty_phase == "skip":
            # the phase has no token on any rank: its loss was identically zero; take no step
            opt.zero_grad(set_to_none=True)
            return
        grad_norm = self._clip_and_norm()
        finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
        if self.world > 1:  # one rank's NaN loss must skip the step everywhere, or the ranks diverge
            finite = self._all_sum(0.0 if finite else 1.0) == 0
        if not finite:
            opt.zero_grad(set_to_none=True)
            self.consecutive_skips += 1
            self.total_skips += 1
            stats["nonfinite_skipped"].append(1.0)
            if self.consecutive_skips >= a.max_consecutive_skips:
                raise NonFiniteAbort(
                    f"{self.consecutive_skips} consecutive optimizer steps had a non-finite loss or gradient "
                    f"(last loss={loss_total}, grad_norm={grad_norm}) at rollout step {self.rollout_step}. "
                    "Lower optim.lr, check the reward and the data, or raise algorithm.max_consecutive_skips.")
            return
        self.consecutive_skips = 0
        opt.step()
        if self.cfg.optim.scheduler_interval == "optimizer_step":
            sched.step()
        self.weight_version += 1
        stats["loss"].append(loss_total)
        stats["grad_norm"].append(grad_norm)
        stats["steps"].append(1.0)
        for k, v in step_metrics.items():
            stats[k].append(sum(v) if k == "tokens" else sum(v) / len(v))

    def _end_of_phase_pass(self, order: list[tuple[str, list[int]]], i: int) -> None:
        """``optim.scheduler_interval=phase`` (official): step the LR scheduler once after each run
        of consecutive optimizer steps of one phase in ``order`` (one ``update_actor`` call in
        verl 0.2: with ``granularity=batch`` once per phase), whether or not steps were taken."""
        if self.cfg.optim.scheduler_interval != "phase":
            return
        if i + 1 == len(order) or order[i + 1][0] != order[i][0]:
            self.lr_schedulers().step()

    # ------------------------------------------------------------------ metrics
    def _padding_metrics(self, exp: Experience, micro_plan: dict[tuple[int, ...], list[list[int]]]) -> dict[str, float]:
        """``update/valid_token_frac``: real (attention-mask) tokens / padded tokens the training
        forwards compute, over one pass of this rank's micro-batches; ``update/micro_batches``:
        micro-batches per optimizer step (mean over mini-batches)."""
        valid = padded = 0
        for mbs in micro_plan.values():
            for mb in mbs:
                lengths = exp.response_mask[mb].sum(-1).tolist()
                cost = micro_batch_cost([int(x) for x in lengths], exp.prompt_len)
                width = cost // len(mb)
                padded += cost
                valid += int(exp.attention_mask[mb, :width].sum())
        n_steps = max(1, len(micro_plan))
        return {"update/valid_token_frac": valid / max(1, padded),
                "update/micro_batches": sum(len(v) for v in micro_plan.values()) / n_steps}

    def _rollout_metrics(self, exp: Experience, old_logp: Tensor, adv_raw: Tensor, adv: Tensor,
                         phases: list[Phase]) -> dict[str, float]:
        mask = exp.response_mask.bool()
        lengths = exp.response_mask.sum(-1)
        out = {
            "reward/mean": float(exp.rewards.mean()),
            "reward/std": float(exp.rewards.std()) if len(exp) > 1 else 0.0,
            "reward/accuracy": float(exp.correct.float().mean()),
            "reward/zero_std_group_frac": zero_std_group_fraction(exp.rewards, exp.group_ids),
            "rollout/response_len_mean": float(lengths.mean()),
            "rollout/response_len_max": float(lengths.max()),
            "rollout/truncated_frac": float(exp.truncated.float().mean()),
            "rollout/responses": float(len(exp)),
            "rollout/tokens": float(mask.sum()),
        }
        for k, v in exp.components.items():
            out[f"reward/{k}"] = float(v.float().mean())
        p = torch.exp(old_logp)[mask]
        out["rollout/token_prob_mean"] = float(p.mean()) if p.numel() else 0.0
        if self.cfg.algorithm.ar_alpha > 0:
            out["ar/weight_mean"] = float(ar_weights(old_logp, self.cfg.algorithm.ar_alpha)[mask].mean())
        for ph in phases:
            if ph.name != "all":
                out[f"lopti/{ph.name}_tokens"] = float(ph.token_mask.sum())
                out[f"lopti/{ph.name}_frac"] = float(ph.token_mask.sum()) / max(1.0, float(mask.sum()))
        return out

    def _reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Combine every metric over ranks: counts and throughput summed, maxima and wall times
        maxed, the rest averaged over the ranks that report them. Ranks may report different keys
        (e.g. reward components of different tasks): the union is reduced. Reward and length means
        are exact (every rank holds the same number of responses); ``reward/std`` is the mean of
        the per-rank stds."""
        if self.world == 1:
            return metrics
        import torch.distributed as dist

        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, sorted(metrics))
        keys = sorted({k for ks in gathered for k in ks})
        present = [1.0 if k in metrics else 0.0 for k in keys]
        values = [float(metrics.get(k, 0.0)) for k in keys]
        maxed = [metrics.get(k, -math.inf) if _reduce_kind(k) == "max" else -math.inf for k in keys]
        summed = self.trainer.strategy.reduce(
            torch.tensor(values + present, device=self.device, dtype=torch.float64), reduce_op="sum").tolist()
        maxima = self.trainer.strategy.reduce(
            torch.tensor(maxed, device=self.device, dtype=torch.float64), reduce_op="max").tolist()
        out = {}
        for i, k in enumerate(keys):
            kind, total, count = _reduce_kind(k), summed[i], summed[len(keys) + i]
            out[k] = maxima[i] if kind == "max" else total if kind == "sum" else total / max(count, 1.0)
        return out

    def _log_step(self, metrics: dict[str, float], exp: Experience, old_logp: Tensor) -> None:
        self.log("reward", metrics["reward/mean"], prog_bar=True, on_step=True, rank_zero_only=True)
        self.log("rollout_step", float(self.rollout_step), prog_bar=True, on_step=True, rank_zero_only=True)
        if self._trainer is None or self.trainer.global_rank != 0:
            return
        for logger in self.loggers:
            logger.log_metrics(metrics, step=self.rollout_step)
            writer = getattr(logger, "experiment", None)
            if writer is not None and hasattr(writer, "add_histogram"):
                p = torch.exp(old_logp)[exp.response_mask.bool()]
                if p.numel():
                    writer.add_histogram("rollout/token_prob_hist", p.float().cpu(), self.rollout_step)
                for i in range(min(self.log_completions, len(exp))):
                    prompt = exp.prompt_texts[i][-300:] if exp.prompt_texts else ""
                    text = (f"**reward {float(exp.rewards[i]):.2f}**\n\n    ...{prompt}\n\n    "
                            + exp.response_texts[i].replace("\n", "\n    "))
                    writer.add_text(f"samples/{i}", text, self.rollout_step)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Counters and every rank's RNG states (collective when distributed: all ranks save)."""
        rng = [capture_rng_state()]
        if self.world > 1:
            import torch.distributed as dist

            rng = [None] * self.world
            dist.all_gather_object(rng, capture_rng_state())
        checkpoint["arlopti"] = {"rollout_step": self.rollout_step, "weight_version": self.weight_version,
                                 "total_skips": self.total_skips, "consecutive_skips": self.consecutive_skips,
                                 "world_size": self.world, "rng": rng}
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("ref.")]:
            del state[key]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # single-file checkpoints; FSDP2 folders are checked by the DCP loader
            _check_policy_keys(checkpoint["state_dict"], self.policy)
        extra = checkpoint.get("arlopti", {})
        self.rollout_step = int(extra.get("rollout_step", 0))
        self.weight_version = int(extra.get("weight_version", 0)) + 1  # force an engine sync
        self.total_skips = int(extra.get("total_skips", 0))
        self.consecutive_skips = int(extra.get("consecutive_skips", 0))
        rng = extra.get("rng") or []
        rank = self.trainer.global_rank if self._trainer is not None else 0
        # Applied in on_train_start, after Lightning has built the dataloader iterator (which draws
        # from torch's generator), so the first resumed step starts from the saved state exactly.
        self._pending_rng = rng[rank] if rank < len(rng) and len(rng) == self.world else None
        if rng and self._pending_rng is None:
            log.warning("checkpoint saved by %d ranks, resuming on %d: RNG states are not restored",
                        len(rng), self.world)

    def on_train_start(self) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None


def _reduce_kind(key: str) -> str:
    if key in _SUM_METRICS or key.endswith(_SUM_SUFFIXES):
        return "sum"
    if key.endswith(_MAX_SUFFIXES):
        return "max"
    return "mean"


def _drop_reference_weights(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook of GRPOModule: the frozen reference model is never saved."""
    for key in [k for k in state_dict if k.startswith(prefix + "ref.")]:
        del state_dict[key]


def _check_policy_keys(state_dict: dict, policy) -> None:
    """Raise if a checkpoint's ``policy.*`` tensors do not match this policy's names and shapes."""
    from arlopti.config import ConfigError

    saved = {k[len("policy."):]: v for k, v in state_dict.items() if k.startswith("policy.")}
    own = policy.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = sorted(k for k in set(own) & set(saved)
                    if hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        def head(xs):
            return xs[:5] + ([f"... {len(xs) - 5} more"] if len(xs) > 5 else [])

        raise ConfigError(
            "the checkpoint's policy weights do not fit this model: "
            f"missing {head(missing)}, unexpected {head(unexpected)}, shape mismatch {head(shapes)}. "
            "It was saved from a different model.* config; resume with the model it was trained with.")


def _to_device(exp: Experience, device) -> Experience:
    if exp.input_ids.device == torch.device(device):
        return exp
    for name in ("input_ids", "attention_mask", "response_mask", "rewards", "group_ids", "truncated", "correct"):
        setattr(exp, name, getattr(exp, name).to(device))
    return exp
