"""The study in the paper's setting at CPU scale: SmolLM2-135M-Instruct on K&K after the demo's cold start.

Two parts, each run in pieces (one process per piece, so that each can hold the CPU lock alone):

**Mechanism** (:func:`kk_mechanism`, ``study kk-mechanism``): the model after the demo's cold start
(6 SFT steps, :func:`arlopti.analysis.inputs.load_policy`, cached), ``--batches`` live K&K batches
(sampling seeds 0, 1, ...), and on each batch ``compare-methods`` for every method it knows, all
from the same weights: per probability bucket the multiplier, the gradient-mass and gradient-norm
shares, each bucket's gradient norm ‖g_b‖ of the method's own loss, and after the method's update
(the demo's optimizer: AdamW at its lr 3e-5, one step per phase) the Fig. 3 fractions and the mean
Δp by sign of A. The top bucket's A > 0 "rose" fraction is the paper's Fig. 3 quantity.

**Learning pilot** (:func:`kk_pilot_run`, ``study kk-run --method M --seed S``, one run per call):
``python train.py experiment=kk_lopti_demo`` with the method's algorithm in place of the demo's
(:func:`algorithm_overrides`: the method's experiment file's ``algorithm`` node, written as
overrides of ``algorithm=grpo``; the demo's ``kl_coef=0`` is kept), ``seed`` and ``rollout.seed`` = S,
:data:`PILOT_OVERRIDES` (two optimizer steps per rollout step, below), the in-training evaluations off
and the final weights saved; then ``python eval.py`` on those
weights: greedy, on ``--val-per-n`` generated validation puzzles per N of 2 and 3 people (the same
puzzles for every run), its per-item records in ``eval_results.json``. The run's composed config is
checked to hold the method's algorithm.

**Report** (:func:`kk_pilot_report`, ``study kk-report``): per method, the final greedy accuracy of
each seed; against GRPO, :func:`arlopti.eval.compare.compare` per seed (paired by puzzle) and over
all seeds at once (each seed's sets renamed ``s<seed>/<set>``, so the pairs are (seed, puzzle) and
the bootstrap draws puzzles within each seed's sets).
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

log = logging.getLogger(__name__)

DEMO_EXPERIMENT = "kk_lopti_demo"
#: The demo's cold start (configs/experiment/kk_lopti_demo.yaml: callbacks.cold_start.steps).
DEMO_COLD_START_STEPS = 6
#: The demo's optimizer (AdamW, lr 3e-5), for the mechanism's one-step updates.
DEMO_LR = 3e-5
DEMO_MAX_NEW_TOKENS = 128
#: The pilot's changes to the demo's sizes. ``sizes.mini_batch_size=4``: the demo's 8 responses per step in
#: two optimizer steps, the second off-policy, as the paper's K&K runs (512 responses in mini-batches of
#: 256, configs/experiment/kk_grpo.yaml) and the toy study (two mini-batches per step). With the demo's
#: one mini-batch every ratio is 1 at its only step, where SAPO and CE-GPPO take GRPO's gradient
#: (docs/algorithms.md: they differ only off-policy): the pilot could not tell them from GRPO.
PILOT_OVERRIDES = ("sizes.mini_batch_size=4",)


# ------------------------------------------------------------------------------------------ method overrides
def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _hydra_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


@functools.lru_cache(maxsize=None)
def algorithm_fields(method: str, max_new_tokens: int = DEMO_MAX_NEW_TOKENS, config_dir=None) -> tuple:
    """``((dotted key, value), ...)``: the method's :func:`~.study_methods.method_algorithm`, flattened;
    composed once per process and arguments (a compose costs about a second)."""
    from arlopti.analysis.study_methods import method_algorithm

    return tuple(_flatten(asdict(method_algorithm(method, max_new_tokens, config_dir))).items())


def algorithm_overrides(method: str, max_new_tokens: int = DEMO_MAX_NEW_TOKENS, config_dir=None) -> list[str]:
    """``["algorithm=grpo", "algorithm.<key>=<value>", ...]``: the method's ``algorithm`` node as
    overrides of GRPO's, every key where it differs except ``kl_coef`` (the demo's 0 is kept)."""
    base = dict(algorithm_fields("grpo", max_new_tokens, config_dir))
    return ["algorithm=grpo"] + [f"algorithm.{k}={_hydra_value(v)}" for k, v in
                                 algorithm_fields(method, max_new_tokens, config_dir)
                                 if k != "kl_coef" and base.get(k) != v]


# ------------------------------------------------------------------------------------------ the pilot
def pilot_dir(out: str | Path, method: str, seed: int) -> Path:
    return Path(out) / "pilot" / method / f"seed{seed}"


def train_command(method: str, seed: int, run_dir: Path, extra: tuple[str, ...] = (), config_dir=None,
                  overrides: list[str] | None = None) -> list[str]:
    """The ``train.py`` command of one pilot run (module docstring); ``extra``: more overrides, last;
    ``overrides``: the method's :func:`algorithm_overrides` when the caller has them (two composes less)."""
    overrides = algorithm_overrides(method, config_dir=config_dir) if overrides is None else overrides
    ckpt = (f"callbacks.model_checkpoint={{_target_:arlopti.callbacks.checkpointing.RolloutCheckpoint,"
            f"dirpath:{run_dir}/checkpoints,every_n_steps:null,save_last:true}}")
    return [sys.executable, "train.py", f"experiment={DEMO_EXPERIMENT}", *overrides, *PILOT_OVERRIDES,
            f"seed={seed}", f"rollout.seed={seed}", f"hydra.run.dir={run_dir}", "logger=csv", ckpt,
            "callbacks.benchmark_eval.before_training=false", "callbacks.benchmark_eval.at_end=false", *extra]


def eval_command(run_dir: Path, val_per_n: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``eval.py`` command scoring a pilot run's final weights (module docstring)."""
    return [sys.executable, "eval.py", "model=smollm2-135m-instruct", f"ckpt_path={run_dir}/checkpoints/last.ckpt",
            "eval=val", "data=kk_generated", "data.val_people=[2,3]", f"data.val_count_per_n={val_per_n}",
            f"rollout.max_new_tokens={DEMO_MAX_NEW_TOKENS}", "rollout.generation_batch_size=16",
            f"output_file={run_dir}/eval_results.json", f"hydra.run.dir={run_dir}/eval", *extra]


def _run(cmd: list[str], log_file: Path) -> float:
    t0 = time.perf_counter()
    with open(log_file, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=Path.cwd(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {done.returncode}); its output: {log_file}")
    return time.perf_counter() - t0


def check_run_algorithm(run_dir: Path, method: str, config_dir=None) -> None:
    """Refuse a run whose composed ``algorithm`` is not the method's (``kl_coef`` aside)."""
    from omegaconf import OmegaConf

    from arlopti.config import AlgorithmConfig, from_dict

    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    got = _flatten(asdict(from_dict(AlgorithmConfig, OmegaConf.to_container(saved.algorithm, resolve=True),
                                    "algorithm")))
    want = dict(algorithm_fields(method, DEMO_MAX_NEW_TOKENS, config_dir))
    diff = sorted(k for k, v in want.items() if k != "kl_coef" and v != got.get(k))
    if diff:
        raise RuntimeError(f"{run_dir}: the run's algorithm differs from kk_{method}'s at {diff}")


def kk_pilot_run(method: str, seed: int, out: str | Path, val_per_n: int = 32, train_extra: tuple[str, ...] = (),
                 eval_extra: tuple[str, ...] = (), keep_checkpoint: bool = False, config_dir=None) -> dict:
    """One pilot run and its evaluation (module docstring); returns the run's record. ``*_extra``:
    overrides appended to each command (tests: the tiny model, one step); the checkpoint is deleted
    after the evaluation unless ``keep_checkpoint``."""
    run_dir = pilot_dir(out, method, seed).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = algorithm_overrides(method, config_dir=config_dir)
    train_s = _run(train_command(method, seed, run_dir, train_extra, config_dir, overrides), run_dir / "train.log")
    check_run_algorithm(run_dir, method, config_dir)
    eval_s = _run(eval_command(run_dir, val_per_n, eval_extra), run_dir / "eval.log")
    if not keep_checkpoint:  # ~1.6 GB with the optimizer state for SmolLM2; the evaluation is what is kept
        (run_dir / "checkpoints" / "last.ckpt").unlink()
    record = {"method": method, "seed": seed, "train_s": train_s, "eval_s": eval_s, "val_per_n": val_per_n,
              "overrides": overrides, "pilot_overrides": list(PILOT_OVERRIDES),
              "train_extra": list(train_extra), "eval_extra": list(eval_extra)}
    (run_dir / "pilot_run.json").write_text(json.dumps(record, indent=1))
    return record
