"""One training run of the study's controlled setting: the tiny model on the "first half" task.

:func:`train_toy_run` builds the learner (:class:`arlopti.learner.module.GRPOModule`) with a
method's :class:`~arlopti.config.AlgorithmConfig` and fits it with Lightning for ``steps``
rollout steps. Each run writes, into its own folder:

* ``metrics.csv``: the learner's own per-step log (Lightning's CSV logger, every tag of
  docs/metrics.md at ``step`` = the rollout step) - the record the study's tables are checked against;
* ``steps.jsonl``: one line per rollout step from :class:`StepRecorder`: the mean reward and, after
  that step's update, Fig. 3's counts and the Δp sums per probability bucket (below).

The seed ``s`` of a run sets everything random: the tiny model's initialisation
(``model.tiny.seed``), the prompt order (the DataModule's seed), the rollout seed and Lightning's
global seed. Every method run with seed ``s`` therefore starts from the same weights and samples
the same first batch: the seeds are the pairs of the paired comparison.

Rollouts (:class:`StudyRollouts`): the rollout seam's HF source (:class:`arlopti.rollout.source.HFRollouts`,
the one :class:`arlopti.callbacks.rollout.RolloutCallback` uses, same seeds) collects ``group_size``
episodes per prompt, the task scores them and :func:`~arlopti.learner.experience.build_experience`
lays them out: the rollout callback's path for a colocated HF run without DAPO's dynamic sampling.
The analysis layer may not import the callbacks (they import it), hence this small callback;
tests/analysis/test_study.py checks that both give the same rewards.

After each step (:class:`StepRecorder`, on the step's own batch, buckets by p_old): one no-grad
forward with the post-update weights gives, per bucket, the A > 0 tokens whose probability rose
(``pos_up`` of ``pos_total``), the A < 0 tokens whose probability fell (``neg_down`` of ``neg_total``)
and the sums of Δp = π_new − π_old over each sign (``dp_pos_sum``, ``dp_neg_sum``). A is the
advantage before AR (AR never flips its sign); tokens with A = 0 count nowhere.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import lightning.pytorch as L
import torch

from arlopti.algorithms.buckets import bucket_sums, update_direction_counts
from arlopti.learner.diagnostics import post_update_log_probs
from arlopti.analysis.study_task import TASK_NAME, FirstHalfData
from arlopti.config import (AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig,
                            TinyModelConfig)
from arlopti.learner.experience import build_experience
from arlopti.rollout.source import HFRollouts
from arlopti.tasks.base import get_task

#: The per-step metrics of the learner that :class:`StepRecorder` keeps in ``steps.jsonl``.
KEPT_METRICS = ("reward/mean", "reward/accuracy")
DIRECTION_KEYS = ("pos_up", "pos_total", "neg_down", "neg_total")


@dataclass(frozen=True)
class ToySizes:
    """The controlled setting's sizes (tests/learner/test_learning.py's): 4 prompts x 4 samples per
    step, 8 new tokens at T = 1, mini-batches of 8 (two AdamW steps per rollout step, the second one
    off-policy), lr 1e-2, no KL; ``warm_start_steps`` > 0: the warm start of
    :mod:`arlopti.analysis.study_task` first."""

    steps: int = 30
    prompts_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 8
    temperature: float = 1.0
    mini_batch_size: int = 8
    lr: float = 1e-2
    prompts: int = 256
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-2


def run_config(algo: AlgorithmConfig, seed: int, sizes: ToySizes) -> RunConfig:
    """The run's config: the method's algorithm without KL (no reference model), the toy sizes."""
    return RunConfig(
        algorithm=replace(algo, kl_coef=0.0),
        sizes=SizesConfig(prompts_per_step=sizes.prompts_per_step, group_size=sizes.group_size,
                          mini_batch_size=sizes.mini_batch_size, micro_batch_size=sizes.mini_batch_size,
                          logprob_micro_batch_size=2 * sizes.mini_batch_size),
        optim=OptimConfig(lr=sizes.lr),
        model=ModelConfig(name_or_path="tiny", tiny=TinyModelConfig(seed=seed)),
        rollout=RolloutConfig(backend="hf", temperature=sizes.temperature, max_new_tokens=sizes.max_new_tokens,
                              seed=seed))


class StudyRollouts(L.Callback):
    """The step's experience: collect, score, lay out (module docstring). ``first_experience`` keeps
    step 0's batch (the mechanism measurements reuse it)."""

    def __init__(self, group_size: int):
        self.group_size = group_size
        self.source = None
        self.task = get_task(TASK_NAME)
        self.first_experience = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if pl_module.cfg.algorithm.dapo.dynamic_sampling:
            raise ValueError("the study's rollouts do not run DAPO's dynamic sampling "
                             "(algorithm.dapo.dynamic_sampling): leave that method out of --methods")
        if self.source is None:
            self.source = HFRollouts.build(pl_module.cfg.rollout, pl_module.policy, pl_module.tokenizer,
                                           self.group_size)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        groups = self.source.collect(pl_module.policy, pl_module.weight_version, pl_module.rollout_step,
                                     batch).groups
        flat = [e for es in groups for e in es]
        gts = [gt for gt, es in zip(batch.ground_truths, groups) for _ in es]
        metas = [m for m, es in zip(batch.metas, groups) for _ in es]
        results = self.task.score([e.text for e in flat], gts, metas)
        exp = build_experience(batch.prompt_ids, groups, results, pad_id=pl_module.tokenizer.pad_token_id,
                               prompt_texts=batch.prompt_texts, metas=batch.metas)
        exp.timings, exp.sampling_stats = {"rollout_s": 0.0, "scoring_s": 0.0, "sync_s": 0.0}, {}
        if self.first_experience is None:
            self.first_experience = exp
        batch.experience = exp


class StepRecorder(L.Callback):
    """Per-step reward and post-update Δp by bucket (module docstring); ``rows`` are the lines of
    ``steps.jsonl``."""

    def __init__(self):
        self.rows: list[dict] = []

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = pl_module.last_step_context
        exp, old, adv = ctx.experience, ctx.old_log_probs, ctx.advantages_raw
        mask = exp.response_mask
        new = post_update_log_probs(pl_module.policy, exp, pl_module.temperature,
                                    pl_module.cfg.sizes.logprob_micro_batch_size)
        counts = update_direction_counts(old, new, adv, mask)
        p_old = torch.exp(old.float())
        dp = torch.exp(new.float()) - p_old
        row = {"step": int(pl_module.rollout_step) - 1, **{k: float(ctx.metrics[k]) for k in KEPT_METRICS
                                                            if k in ctx.metrics}}
        row.update({k: counts[k].tolist() for k in DIRECTION_KEYS})
        row["dp_pos_sum"] = bucket_sums(dp, p_old, mask * (adv > 0).float()).tolist()
        row["dp_neg_sum"] = bucket_sums(dp, p_old, mask * (adv < 0).float()).tolist()
        self.rows.append(row)


def initial_weights(policy, tokenizer, seed: int, sizes: ToySizes, cache: str | Path | None) -> dict:
    """Apply seed ``s``'s warm start to ``policy`` (nothing when ``sizes.warm_start_steps`` is 0);
    the weights are cached as ``<cache>/warm_seed<s>_<steps>x<lr>.safetensors`` when ``cache`` is
    given, so the runs of every method load the same ones. Returns ``{"losses", "cache_hit"}``."""
    from safetensors.torch import load_model, save_model

    from arlopti.analysis.study_task import warm_start

    if sizes.warm_start_steps == 0:
        return {"losses": [], "cache_hit": None}
    file = None
    if cache is not None:
        file = Path(cache) / f"warm_seed{seed}_{sizes.warm_start_steps}x{sizes.warm_start_lr:g}.safetensors"
        if file.exists():
            load_model(policy.hf, str(file))
            return {"losses": json.loads(file.with_suffix(".json").read_text()), "cache_hit": True}
    losses = warm_start(policy, tokenizer, sizes.warm_start_steps, sizes.warm_start_lr, seed)
    if file is not None:  # written under a temporary name, then renamed: a parallel worker may race us
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.stem}.{os.getpid()}.tmp")
        save_model(policy.hf, str(tmp))
        file.with_suffix(".json").write_text(json.dumps(losses))
        tmp.replace(file)
    return {"losses": losses, "cache_hit": False}


def train_toy_run(algo: AlgorithmConfig, seed: int, out_dir: str | Path, sizes: ToySizes = ToySizes(),
                  tokenizer=None, warm_cache: str | Path | None = None) -> dict:
    """Fit one run (module docstring); returns ``{"rows", "first_experience", "folder"}``."""
    from lightning.pytorch.loggers import CSVLogger

    from arlopti.learner.module import GRPOModule
    from arlopti.models.loading import build_tiny_tokenizer

    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    L.seed_everything(seed, verbose=False)
    cfg = run_config(algo, seed, sizes)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=sizes.steps, log_completions=0)
    warm = initial_weights(module.policy, tok, seed, sizes, warm_cache)
    data = FirstHalfData(n=sizes.prompts, tokenizer=tok, prompts_per_step=sizes.prompts_per_step,
                         max_prompt_length=256, seed=seed)
    rollouts, recorder = StudyRollouts(sizes.group_size), StepRecorder()
    # the learner stops itself after total_rollout_steps; the epochs only have to be enough
    epochs = -(-sizes.steps * sizes.prompts_per_step // sizes.prompts) + 1
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs,
                        logger=CSVLogger(str(out), name="", version=""), enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[rollouts, recorder])
    trainer.fit(module, datamodule=data)
    if module.rollout_step != sizes.steps:
        raise RuntimeError(f"the run stopped after {module.rollout_step} of {sizes.steps} rollout steps")
    with open(out / "steps.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in recorder.rows)
    (out / "run.json").write_text(json.dumps({"seed": seed, "sizes": asdict(sizes), "algorithm": asdict(cfg.algorithm),
                                              "warm_start_losses": warm["losses"],
                                              "seconds": time.perf_counter() - t0}, indent=1, default=str))
    return {"rows": recorder.rows, "first_experience": rollouts.first_experience, "folder": str(out)}
