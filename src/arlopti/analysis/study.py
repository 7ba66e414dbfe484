"""``python -m arlopti.analysis study <part>``: both camps of the low-probability-token question, one harness.

Parts (each writes into ``--out``):

* ``toy``: the controlled setting. Every method (:mod:`.study_methods`: GRPO, AR, Lopti, AR + Lopti,
  then every single-method experiment file) x ``--seeds`` seeds, the same seeds for all, on the tiny
  model and the "first half" task (:mod:`.study_task`; ``--warm-start-steps`` > 0 warm-starts the
  model first, the default, because from random initialisation every token sits in the lowest
  bucket). Runs (:mod:`.study_runs`) go to ``runs/<method>/seed<s>/`` (``metrics.csv``, the learner's
  own log; ``steps.jsonl``; ``run.json``) and are reused when their settings match, so adding a method
  runs only its runs; each seed's first-step mechanism (:mod:`.study_mechanism`) goes to
  ``mechanism/seed<s>.json`` (reused likewise). Then ``study.json`` (every number, :mod:`.study_tables`), ``tables.md``
  and ``curves.png``, ``paired.png``, ``mechanism.png``. ``--workers`` processes run the jobs.
* ``kk-mechanism``, ``kk-run``, ``kk-report``: the paper's setting at CPU scale (:mod:`.study_kk`).

Run heavy parts under the CPU lock: ``flock /tmp/arlopti-cpu.lock python -m arlopti.analysis study ...``.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

from arlopti.analysis.study_checks import check_study_args
from arlopti.analysis.study_kk_cli import add_kk_args

log = logging.getLogger("arlopti.analysis")

PARTS = ("toy", "kk-mechanism", "kk-run", "kk-report")


def add_study_args(p) -> None:
    sub = p.add_subparsers(dest="study_command", required=True)
    t = sub.add_parser("toy", help="the controlled setting: the tiny model on the first-half task")
    t.add_argument("--out", default="study_out/toy", help="output folder (default: %(default)s)")
    t.add_argument("--methods", default=None, help="comma list of experiment names kk_<name> (default: all; "
                                                    "GRPO is always added)")
    t.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1, the same for every method")
    t.add_argument("--steps", type=int, default=30, help="rollout steps per run")
    t.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate of the runs")
    t.add_argument("--warm-start-steps", type=int, default=100, help="SFT steps before RL (0: the plain toy task)")
    t.add_argument("--threshold", type=float, default=0.6, help="reward of the steps-to-threshold column")
    t.add_argument("--final-window", type=int, default=5, help="last steps averaged into the final reward")
    t.add_argument("--workers", type=int, default=2, help="processes running the runs")
    t.add_argument("--threads", type=int, default=1, help="torch threads per process")
    t.add_argument("--skip-mechanism", action="store_true", help="no first-step compare-methods per seed")
    add_kk_args(sub)


def cmd_study(args) -> dict:
    """Dispatch ``study <part>``, its numeric options checked first (:mod:`.study_checks`)."""
    check_study_args(args)
    if args.study_command == "toy":
        return toy_study(args)
    if args.study_command == "kk-mechanism":
        from arlopti.analysis.study_kk_mechanism import kk_mechanism

        return kk_mechanism(args)
    if args.study_command == "kk-run":
        from arlopti.analysis.study_kk import kk_pilot_run

        return {"files": kk_pilot_run(args.method, args.seed, args.out, args.val_per_n,
                                      keep_checkpoint=args.keep_checkpoint)}
    from arlopti.analysis.study_kk_report import kk_report

    return kk_report(args)


# ------------------------------------------------------------------------------------------ jobs
_TOKENIZER = None


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    logging.disable(logging.WARNING)  # Lightning's per-run banners, hundreds of times


def _tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from arlopti.models.loading import build_tiny_tokenizer

        _TOKENIZER = build_tiny_tokenizer()
    return _TOKENIZER


def run_job(job: tuple) -> tuple:
    """One job, in a worker: ``("run", method, algo, seed, sizes, folder, warm)`` or
    ``("mechanism", seed, algos, sizes, file, warm)``; returns ``(kind, key, seconds)``."""
    import warnings

    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    if job[0] == "run":
        from arlopti.analysis.study_runs import train_toy_run

        _, method, algo, seed, sizes, folder, warm = job
        train_toy_run(algo, seed, folder, sizes, _tokenizer(), warm)
        key = (method, seed)
    else:
        from arlopti.analysis.study_mechanism import seed_mechanism

        _, seed, algos, sizes, file, warm = job
        result = {**seed_mechanism(seed, algos, sizes, _tokenizer(), warm), "sizes": asdict(sizes),
                  "seconds": time.perf_counter() - t0}
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        Path(file).write_text(json.dumps(result, indent=1, default=str))
        key = seed
    return job[0], key, time.perf_counter() - t0


def run_jobs(jobs: list[tuple], workers: int, threads: int) -> list[tuple]:
    if workers <= 1 or len(jobs) <= 1:
        import torch

        before = torch.get_num_threads()
        _init_worker(threads)
        try:
            return [run_job(j) for j in jobs]
        finally:  # in the caller's process: give its logging and threads back
            logging.disable(logging.NOTSET)
            torch.set_num_threads(before)
    with ProcessPoolExecutor(workers, mp_context=get_context("fork"), initializer=_init_worker,
                             initargs=(threads,)) as pool:
        return list(pool.map(run_job, jobs))


def run_is_done(folder: Path, seed: int, algo, sizes) -> bool:
    """Whether ``folder`` holds a finished run with exactly these settings (then it is reused)."""
    try:
        saved = json.loads((folder / "run.json").read_text())
        rows = (folder / "steps.jsonl").read_text().splitlines()
    except (OSError, json.JSONDecodeError):
        return False
    from dataclasses import replace

    want = json.loads(json.dumps({"seed": seed, "sizes": asdict(sizes),
                                  "algorithm": asdict(replace(algo, kl_coef=0.0))}, default=str))
    return all(saved.get(k) == v for k, v in want.items()) and len(rows) == sizes.steps


def mechanism_is_done(file: Path, algos: dict, sizes) -> bool:
    """Whether ``file`` holds a seed's mechanism for these methods and sizes (then it is reused)."""
    try:
        saved = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    measured = set(saved.get("methods", {})) | set(saved.get("not_measured", []))
    return saved.get("sizes") == json.loads(json.dumps(asdict(sizes))) and measured == set(algos)


# ------------------------------------------------------------------------------------------ the toy study
def toy_study(args) -> dict:
    from arlopti.analysis.study_methods import method_algorithms, parse_methods
    from arlopti.analysis.study_runs import ToySizes

    out = Path(args.out)
    t0 = time.perf_counter()
    methods = parse_methods(args.methods)
    sizes = ToySizes(steps=args.steps, lr=args.lr, warm_start_steps=args.warm_start_steps)
    algos = method_algorithms(methods, sizes.max_new_tokens)
    seeds = list(range(args.seeds))
    warm = out / "warm_start"
    jobs = [("run", m, algos[m], s, sizes, str(out / "runs" / m / f"seed{s}"), str(warm)) for s in seeds
            for m in methods if not run_is_done(out / "runs" / m / f"seed{s}", s, algos[m], sizes)]
    if not args.skip_mechanism:
        jobs += [("mechanism", s, algos, sizes, str(out / "mechanism" / f"seed{s}.json"), str(warm)) for s in seeds
                 if not mechanism_is_done(out / "mechanism" / f"seed{s}.json", algos, sizes)]
    log.info("study toy: %d methods x %d seeds, %d jobs to run", len(methods), len(seeds), len(jobs))
    done = run_jobs(jobs, args.workers, args.threads)
    timings = {"jobs_s": time.perf_counter() - t0,
               "run_s": [s for kind, _, s in done if kind == "run"],
               "mechanism_s": [s for kind, _, s in done if kind == "mechanism"]}
    from arlopti.analysis.study_report import write_toy_report

    return write_toy_report(out, methods, seeds, sizes, args, timings)
