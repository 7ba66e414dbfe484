"""One training run of the study's controlled setting, through the training seam: :func:`arlopti.run`.

:func:`train_toy_run` trains one method on the tiny model and the "first half" task exactly as
``arlopti train <overrides>`` would, with :func:`run_overrides`: the method's algorithm (its experiment
file's ``algorithm`` node as overrides of GRPO's, :func:`arlopti.study.methods.algorithm_overrides`,
without KL, so no reference model), the toy sizes (:class:`ToySizes`), the tiny model with
``model.tiny.seed`` = s, the task's data module (:class:`arlopti.study.toy_task.FirstHalfData`), fp32, the
CSV logger, and of the optional callbacks only the study's two: :class:`ToyWarmStart` and
:class:`StepRecorder`. A step is therefore the training loop's own: the rollout callback
(:class:`arlopti.callbacks.rollout.RolloutCallback`) collects, scores and lays out the experience, the
learner updates. Each run writes, into its own folder (Hydra's run folder, with ``.hydra/`` and ``train.log``):

* ``csv/metrics.csv``: the learner's own per-step log (every tag of docs/metrics.md), the record the
  study's tables are checked against;
* ``steps.jsonl``: one line per rollout step from :class:`StepRecorder`: the mean reward and, after
  that step's update, Fig. 3's counts and the Δp sums per probability bucket (below);
* ``first_batch.pt``: the experience of rollout step 1, on which the seed's mechanism is measured
  (:mod:`arlopti.study.mechanism`);
* ``warm_start.json`` (the warm start's losses) and, last, ``run.json``: the seed, the sizes, the run's
  algorithm as composed, the warm start's losses and the wall time. A folder without ``run.json`` is an
  unfinished run, run again by the next call.

The seed ``s`` of a run sets everything random: the tiny model's initialisation (``model.tiny.seed``), the
prompt order (the data module's seed), the rollout seed (``rollout.seed`` = ``seed``) and Lightning's global
seed. Every method run with seed ``s`` therefore starts from the same weights and samples the same first
batch: the seeds are the pairs of the paired comparison.

After each step (:class:`StepRecorder`, on the step's own batch, buckets by p_old): one no-grad forward
with the post-update weights gives, per bucket, the A > 0 tokens whose probability rose (``pos_up`` of
``pos_total``), the A < 0 tokens whose probability fell (``neg_down`` of ``neg_total``) and the sums of
Δp = π_new − π_old over each sign (``dp_pos_sum``, ``dp_neg_sum``). A is the advantage before AR (AR never
flips its sign); tokens with A = 0 count nowhere.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as L
import torch

from arlopti.plugins.buckets import bucket_sums, update_direction_counts
from arlopti.learner.diagnostics import post_update_log_probs
from arlopti.config.compose import quoted
from arlopti.study.methods import algorithm_overrides, check_run_algorithm, run_algorithm

#: The per-step metrics of the learner that :class:`StepRecorder` keeps in ``steps.jsonl``.
KEPT_METRICS = ("reward/mean", "reward/accuracy")
DIRECTION_KEYS = ("pos_up", "pos_total", "neg_down", "neg_total")
#: What :class:`StepRecorder` keeps of step 1's experience (the mechanism's batch).
FIRST_BATCH_KEYS = ("input_ids", "attention_mask", "response_mask", "prompt_len", "rewards", "group_ids",
                    "response_texts")


@dataclass(frozen=True)
class ToySizes:
    """The controlled setting's sizes (tests/learner/test_learning.py's): 4 prompts x 4 samples per
    step, 8 new tokens at T = 1, mini-batches of 8 (two AdamW steps per rollout step, the second one
    off-policy), lr 1e-2, no KL; ``warm_start_steps`` > 0: the warm start of
    :mod:`arlopti.study.toy_task` first."""

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


def run_overrides(method: str, seed: int, folder: Path, sizes: ToySizes, warm_cache: str | Path | None = None,
                  config_dir=None) -> list[str]:
    """The overrides of one toy run (module docstring); ``folder`` is its run folder."""
    s, f = sizes, Path(folder).resolve()
    data = (f"{{_target_:arlopti.study.toy_task.FirstHalfData,n:{s.prompts},prompts_per_step:{s.prompts_per_step},"
            f"max_prompt_length:256,seed:{seed}}}")
    warm = (f"{{_target_:arlopti.study.toy_run.ToyWarmStart,seed:{seed},steps:{s.warm_start_steps},"
            f"lr:{s.warm_start_lr!r},folder:{quoted(f)},cache:{quoted(warm_cache) if warm_cache else 'null'}}}")
    epochs = -(-s.steps * s.prompts_per_step // s.prompts) + 1  # the learner stops itself after rollout_steps
    return [*algorithm_overrides(method, s.max_new_tokens, config_dir), "algorithm.kl_coef=0.0",
            "model=tiny", f"model.tiny.seed={seed}", "rollout=hf", f"rollout.temperature={s.temperature!r}",
            f"rollout.max_new_tokens={s.max_new_tokens}", f"seed={seed}", f"rollout_steps={s.steps}",
            f"sizes.prompts_per_step={s.prompts_per_step}", f"sizes.group_size={s.group_size}",
            f"sizes.mini_batch_size={s.mini_batch_size}", f"sizes.micro_batch_size={s.mini_batch_size}",
            f"sizes.logprob_micro_batch_size={2 * s.mini_batch_size}", f"optim.lr={s.lr!r}",
            "~data", f"+data={data}", "callbacks=none", f"+callbacks.study_warm_start={warm}",
            f"+callbacks.study_steps={{_target_:arlopti.study.toy_run.StepRecorder,folder:{quoted(f)}}}",
            "logger=csv", "trainer.precision=32-true", f"trainer.max_epochs={epochs}",
            "trainer.enable_model_summary=false", "+trainer.enable_progress_bar=false",
            "+trainer.enable_checkpointing=false", "task_name=study_toy", f"hydra.run.dir={quoted(f)}"]


class ToyWarmStart(L.Callback):
    """The warm start (:func:`initial_weights`) of the run's policy, in ``setup``: before the rollout callback
    builds its engine on the policy (the callbacks of the config come before it) and before any step.
    Its losses go to ``<folder>/warm_start.json``."""

    def __init__(self, seed: int, steps: int, lr: float, folder: str, cache: str | None = None):
        self.seed, self.steps, self.lr, self.folder, self.cache = seed, steps, lr, Path(folder), cache

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        warm = initial_weights(pl_module.policy, pl_module.tokenizer, self.seed, self.steps, self.lr, self.cache)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "warm_start.json").write_text(json.dumps(warm))


class StepRecorder(L.Callback):
    """Per-step reward and post-update Δp by bucket into ``<folder>/steps.jsonl``, a line per step as it
    ends, and step 1's experience into ``<folder>/first_batch.pt`` (module docstring)."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.rows: list[dict] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "steps.jsonl").write_text("")  # a cut-short attempt's lines are not kept

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        ctx = pl_module.last_step_context
        exp, old, adv = ctx.experience, ctx.old_log_probs, ctx.advantages_raw
        if not self.rows:
            torch.save({k: getattr(exp, k) for k in FIRST_BATCH_KEYS}, self.folder / "first_batch.pt")
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
        with open(self.folder / "steps.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def initial_weights(policy, tokenizer, seed: int, steps: int, lr: float, cache: str | Path | None) -> dict:
    """Apply seed ``s``'s warm start to ``policy`` (nothing when ``steps`` is 0); the weights are cached as
    ``<cache>/warm_seed<s>_<steps>x<lr>.safetensors`` when ``cache`` is given, so the runs of every method
    load the same ones. Returns ``{"losses", "cache_hit"}``."""
    from safetensors.torch import load_model, save_model

    from arlopti.study.toy_task import warm_start

    if steps == 0:
        return {"losses": [], "cache_hit": None}
    file = None
    if cache is not None:
        file = Path(cache) / f"warm_seed{seed}_{steps}x{lr:g}.safetensors"
        if file.exists():
            load_model(policy.hf, str(file))
            return {"losses": json.loads(file.with_suffix(".json").read_text()), "cache_hit": True}
    losses = warm_start(policy, tokenizer, steps, lr, seed)
    if file is not None:  # written under a temporary name, then renamed: a parallel worker may race us
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.stem}.{os.getpid()}.tmp")
        save_model(policy.hf, str(tmp))
        file.with_suffix(".json").write_text(json.dumps(losses))
        tmp.replace(file)
    return {"losses": losses, "cache_hit": False}


def read_rows(folder: Path) -> list[dict]:
    """The ``steps.jsonl`` lines of a run folder."""
    return [json.loads(line) for line in (Path(folder) / "steps.jsonl").read_text().splitlines() if line.strip()]


def train_toy_run(method: str, seed: int, out_dir: str | Path, sizes: ToySizes = ToySizes(),
                  warm_cache: str | Path | None = None, config_dir=None) -> dict:
    """Train one run through :func:`arlopti.run` (module docstring), check that it ran every step with the
    method's algorithm, write ``run.json``; returns ``{"rows", "folder"}``."""
    from arlopti.entry.api import run

    t0 = time.perf_counter()
    out = Path(out_dir).resolve()
    (out / "run.json").unlink(missing_ok=True)
    run(run_overrides(method, seed, out, sizes, warm_cache, config_dir))
    rows = read_rows(out)
    if len(rows) != sizes.steps:
        raise RuntimeError(f"{out}: the run stopped after {len(rows)} of {sizes.steps} rollout steps")
    check_run_algorithm(out, method, sizes.max_new_tokens, config_dir, also={"kl_coef": 0.0})
    warm = json.loads((out / "warm_start.json").read_text())
    (out / "run.json").write_text(json.dumps({"seed": seed, "sizes": asdict(sizes), "algorithm": run_algorithm(out),
                                              "warm_start_losses": warm["losses"],
                                              "seconds": time.perf_counter() - t0}, indent=1, default=str))
    return {"rows": rows, "folder": str(out)}
