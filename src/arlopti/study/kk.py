"""The study in the paper's setting at CPU scale: SmolLM2-135M-Instruct on K&K after the demo's cold start.

Two parts, each run in pieces (one process per piece, so that each can hold the CPU lock alone):

**Mechanism** (:func:`kk_mechanism`, ``study kk-mechanism``): the model after the demo's cold start
(6 SFT steps, :func:`arlopti.analysis.inputs.load_policy`, cached; :mod:`.kk_mechanism`), ``--batches``
live K&K batches (sampling seeds 0, 1, ...), and on each batch ``compare-methods`` for every method it knows, all
from the same weights: per probability bucket the multiplier, the gradient-mass and gradient-norm
shares, each bucket's gradient norm ‖g_b‖ of the method's own loss, and after the method's update
(the demo's optimizer: AdamW at its lr 3e-5, one step per phase) the Fig. 3 fractions and the mean
Δp by sign of A. The top bucket's A > 0 "rose" fraction is the paper's Fig. 3 quantity.

**Learning pilot** (:func:`kk_pilot_run`, ``study kk-run --method M --seed S``, one run per call):
``arlopti train experiment=kk_lopti_demo`` (:func:`arlopti.run`, in this process) with the method's
algorithm in place of the demo's (:func:`arlopti.study.methods.algorithm_overrides`: the method's
experiment file's ``algorithm`` node, written as overrides of ``algorithm=grpo``; the demo's
``kl_coef=0`` is kept), ``seed`` and ``rollout.seed`` = S, :data:`PILOT_OVERRIDES` (two optimizer steps
per rollout step, below), the in-training evaluations off and the final weights saved; then
``arlopti eval`` on those weights (:func:`evaluate_job`): greedy, on ``--val-per-n`` generated validation
puzzles per N of 2 and 3 people (the same puzzles for every run), its per-item records in
``eval_results.json``. The run's composed config is
checked to hold the method's algorithm.

Each run's folder is ``<out>/pilot/<method>/seed<s>/``; a second call for a finished run reuses it.

**Report** (:mod:`.kk_report`, ``study kk-report``): per method, the final greedy accuracy of
each seed; against GRPO, :func:`arlopti.eval.compare.compare` per seed (paired by puzzle) and over
all seeds at once (each seed's sets renamed ``s<seed>/<set>``, so the pairs are (seed, puzzle) and
the bootstrap draws puzzles within each seed's sets).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from pathlib import Path

from arlopti.config.compose import quoted
from arlopti.study.methods import algorithm_overrides, check_run_algorithm

log = logging.getLogger(__name__)

DEMO_EXPERIMENT = "kk_lopti_demo"
#: The pilot's changes to the demo's sizes. ``sizes.mini_batch_size=4``: the demo's 8 responses per step in
#: two optimizer steps, the second off-policy, as the paper's K&K runs (512 responses in mini-batches of
#: 256, configs/experiment/kk_grpo.yaml) and the toy study (two mini-batches per step). With the demo's
#: one mini-batch every ratio is 1 at its only step, where SAPO and CE-GPPO take GRPO's gradient
#: (docs/algorithms.md: they differ only off-policy): the pilot could not tell them from GRPO.
PILOT_OVERRIDES = ("sizes.mini_batch_size=4",)


@functools.lru_cache(maxsize=None)
def demo_settings(config_dir=None) -> dict:
    """What the study takes of the demo (``experiment=kk_lopti_demo``, composed once): its cold start's
    ``steps``, its optimizer's ``lr`` (AdamW; the mechanism's one-step updates) and its response length
    ``max_new_tokens`` (``rollout.max_new_tokens``)."""
    from arlopti.config.compose import compose

    cfg = compose([f"experiment={DEMO_EXPERIMENT}"], config_dir=config_dir)
    return {"cold_start_steps": int(cfg.callbacks.cold_start.steps), "lr": float(cfg.optim.lr),
            "max_new_tokens": int(cfg.rollout.max_new_tokens)}


# ------------------------------------------------------------------------------------------ the pilot
def pilot_dir(out: str | Path, method: str, seed: int) -> Path:
    return Path(out) / "pilot" / method / f"seed{seed}"


def train_overrides(method: str, seed: int, run_dir: Path, extra: tuple[str, ...] = (), config_dir=None,
                    overrides: list[str] | None = None) -> list[str]:
    """The ``arlopti train`` overrides of one pilot run (module docstring); ``extra``: more overrides, last;
    ``overrides``: the method's :func:`algorithm_overrides` when the caller has them (two composes less)."""
    if overrides is None:
        overrides = algorithm_overrides(method, demo_settings(config_dir)["max_new_tokens"], config_dir)
    ckpt = (f"callbacks.model_checkpoint={{_target_:arlopti.callbacks.checkpointing.RolloutCheckpoint,"
            f"dirpath:{quoted(run_dir / 'checkpoints')},every_n_steps:null,save_last:true}}")
    return [f"experiment={DEMO_EXPERIMENT}", *overrides, *PILOT_OVERRIDES, f"seed={seed}", f"rollout.seed={seed}",
            f"hydra.run.dir={quoted(run_dir)}", "logger=csv", ckpt, "callbacks.benchmark_eval.before_training=false",
            "callbacks.benchmark_eval.at_end=false", *extra]


def eval_overrides(run_dir: Path, val_per_n: int, extra: tuple[str, ...] = (), config_dir=None) -> list[str]:
    """The ``arlopti eval`` overrides scoring a pilot run's final weights (module docstring)."""
    return ["model=smollm2-135m-instruct", f"ckpt_path={quoted(run_dir / 'checkpoints' / 'last.ckpt')}",
            "eval=val", "data=kk_generated", "data.val_people=[2,3]", f"data.val_count_per_n={val_per_n}",
            f"rollout.max_new_tokens={demo_settings(config_dir)['max_new_tokens']}", "rollout.generation_batch_size=16",
            f"output_file={quoted(run_dir / 'eval_results.json')}", f"hydra.run.dir={quoted(run_dir / 'eval')}",
            *extra]


def evaluate_job(overrides: list[str], config_dir=None) -> None:
    """``arlopti eval <overrides>`` in this process: the eval config composed and run as one Hydra job, as
    ``eval.py``'s ``@hydra.main`` runs it (:func:`arlopti.config.compose.run_job`), then
    :func:`arlopti.entry.evaluate.evaluate`; its failure is raised here with its own message."""
    from arlopti.config.compose import run_job
    from arlopti.entry.evaluate import evaluate

    box: dict = {}

    def task(cfg) -> None:
        try:
            evaluate(cfg)
        except Exception as err:  # noqa: BLE001 - raised below, after the job: Hydra would report it first
            box["error"] = err

    run_job(task, overrides, config_name="eval.yaml", job_name="eval", config_dir=config_dir)
    if "error" in box:
        raise box["error"]


def kk_pilot_run(method: str, seed: int, out: str | Path, val_per_n: int = 32, train_extra: tuple[str, ...] = (),
                 eval_extra: tuple[str, ...] = (), keep_checkpoint: bool = False, config_dir=None) -> dict:
    """One pilot run and its evaluation (module docstring), or the record of the one already in ``out``
    (``pilot/<method>/seed<s>/pilot_run.json``, written last; a folder without it is a cut-short attempt,
    cleared and run again). Training goes through :func:`arlopti.run` and the evaluation through
    :func:`evaluate_job`, in this process. ``*_extra``: overrides appended to each (tests: the tiny model,
    one step); the checkpoint is deleted after the evaluation unless ``keep_checkpoint``."""
    from arlopti.entry.api import run

    run_dir = pilot_dir(out, method, seed).resolve()
    if (run_dir / "pilot_run.json").is_file():
        log.info("kk-run %s seed %d: done (%s), reused", method, seed, run_dir / "pilot_run.json")
        return json.loads((run_dir / "pilot_run.json").read_text())
    if run_dir.exists():  # a cut-short attempt: its metrics.csv would mix into this one's
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    max_new_tokens = demo_settings(config_dir)["max_new_tokens"]
    overrides = algorithm_overrides(method, max_new_tokens, config_dir)
    t0 = time.perf_counter()
    run(train_overrides(method, seed, run_dir, train_extra, config_dir, overrides))
    train_s = time.perf_counter() - t0
    check_run_algorithm(run_dir, method, max_new_tokens, config_dir)
    evaluate_job(eval_overrides(run_dir, val_per_n, eval_extra, config_dir), config_dir)
    eval_s = time.perf_counter() - t0 - train_s
    if not keep_checkpoint:  # ~1.6 GB with the optimizer state for SmolLM2; the evaluation is what is kept
        (run_dir / "checkpoints" / "last.ckpt").unlink()
    record = {"method": method, "seed": seed, "train_s": train_s, "eval_s": eval_s, "val_per_n": val_per_n,
              "overrides": overrides, "pilot_overrides": list(PILOT_OVERRIDES),
              "train_extra": list(train_extra), "eval_extra": list(eval_extra)}
    (run_dir / "pilot_run.json").write_text(json.dumps(record, indent=1))
    return record
