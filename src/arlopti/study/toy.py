"""``arlopti study toy``: the controlled setting, every method x ``--seeds`` seeds on the tiny model.

Every method (:mod:`.methods`: GRPO, AR, Lopti, AR + Lopti, then every single-method experiment file) x
``--seeds`` seeds, the same seeds for all, on the tiny model and the "first half" task (:mod:`.toy_task`;
``--warm-start-steps`` > 0 warm-starts the model first, the default, because from random initialisation
every token sits in the lowest bucket). Each run is a training run through :func:`arlopti.run`
(:mod:`.toy_run`), into ``<out>/runs/<method>/seed<s>/``; then each seed's first-step mechanism
(:mod:`.mechanism`) on its GRPO run's first batch, into ``<out>/mechanism/seed<s>.json``. Then
``study.json`` (every number, :mod:`.tables`), ``summary.json``, ``tables.md`` and ``curves.png``,
``paired.png``, ``mechanism.png`` (:mod:`.report`). ``--workers`` processes run the jobs.

Piece by piece: a run is finished when its ``run.json`` is there with the same settings, a seed's mechanism
when its file is, and both are reused by the next call with the same ``--out`` (adding a method runs only
its runs; a call cut short is finished by calling it again).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

log = logging.getLogger("arlopti.study")


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
    """One job, in a worker: ``("run", method, seed, sizes, folder, warm)`` or
    ``("mechanism", seed, algos, sizes, file, grpo run folder, warm)``; returns ``(kind, key, seconds)``."""
    import warnings

    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    if job[0] == "run":
        from arlopti.study.toy_run import train_toy_run

        _, method, seed, sizes, folder, warm = job
        train_toy_run(method, seed, folder, sizes, warm)
        key = (method, seed)
    else:
        from arlopti.study.mechanism import seed_mechanism

        _, seed, algos, sizes, file, run_folder, warm = job
        result = {**seed_mechanism(seed, algos, sizes, _tokenizer(), run_folder, warm), "sizes": asdict(sizes),
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
    """The runs, then the mechanisms, then the report (module docstring); ``args``: ``study toy``'s options."""
    from arlopti.study.methods import method_algorithms, parse_methods
    from arlopti.study.report import write_toy_report
    from arlopti.study.toy_run import ToySizes

    out = Path(args.out)
    t0 = time.perf_counter()
    methods = parse_methods(args.methods)
    sizes = ToySizes(steps=args.steps, lr=args.lr, warm_start_steps=args.warm_start_steps)
    algos = method_algorithms(methods, sizes.max_new_tokens)
    seeds = list(range(args.seeds))
    warm = str(out / "warm_start")
    runs = [("run", m, s, sizes, str(out / "runs" / m / f"seed{s}"), warm) for s in seeds
            for m in methods if not run_is_done(out / "runs" / m / f"seed{s}", s, algos[m], sizes)]
    log.info("study toy: %d methods x %d seeds, %d runs to train", len(methods), len(seeds), len(runs))
    done = run_jobs(runs, args.workers, args.threads)
    if not args.skip_mechanism:  # after the runs: a seed's mechanism is measured on its GRPO run's first batch
        mechs = [("mechanism", s, algos, sizes, str(out / "mechanism" / f"seed{s}.json"),
                  str(out / "runs" / "grpo" / f"seed{s}"), warm) for s in seeds
                 if not mechanism_is_done(out / "mechanism" / f"seed{s}.json", algos, sizes)]
        done += run_jobs(mechs, args.workers, args.threads)
    timings = {"jobs_s": time.perf_counter() - t0,
               "run_s": [s for kind, _, s in done if kind == "run"],
               "mechanism_s": [s for kind, _, s in done if kind == "mechanism"]}
    return write_toy_report(out, methods, seeds, sizes, args, timings)
