"""Shared helpers for the scripts in ``benchmarks/``: isolated runs, A/B timing, tables, JSON.

Measurement conventions used by every benchmark that imports this module:

* **Peak memory** is the growth of the process's resident-set high-water mark,
  ``ru_maxrss(after) − ru_maxrss(baseline)``, measured in a *fresh* Python process per sample
  (:func:`run_isolated`), with the baseline taken after the inputs exist. ``ru_maxrss`` never
  goes down, so a fresh process is the only way to see one configuration's own peak.
* **Time** is wall-clock seconds of one call, samples of all configurations interleaved
  (:func:`interleaved_order`: A B C, B C A, C A B, ...) so that load from other users of the
  machine hits every configuration alike; report the median.

A child process started by :func:`run_isolated` runs ``python benchmarks/_common.py --call
FILE:FUNC --kwargs JSON``: it imports ``FILE``, calls ``FUNC(**kwargs)`` and prints the returned
JSON-serialisable dict on one line prefixed by :data:`RESULT_MARK`.

The scripts run as ``python benchmarks/<script>.py`` with the project's environment
(``make install``: ``arlopti`` is installed); each imports this module as ``_common``, from its
own folder, which Python puts first on ``sys.path`` when it runs a script. The GPU checks run
on a bare checkout through ``benchmarks/gpu_check.sh``, which sets ``PYTHONPATH=src``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

RESULT_MARK = "__BENCH_RESULT__ "
OUT_DIR = Path(__file__).resolve().parent / "out"
REPO = Path(__file__).resolve().parent.parent
# The chat prompts of the decoding benchmarks (bench_decode, bench_rollout): lengths differ, so rows pad.
CHAT_PROMPTS = [
    "What is 17 * 23? Think step by step.",
    "Knights always tell the truth and knaves always lie. Zoey says Oliver is a knave. Who is who?",
    "Write a short poem about the sea.",
    "Explain what a prime number is to a child.",
    "List three uses of a paperclip.",
    "Solve for x: 3x + 5 = 20.",
    "What is the capital of France, and why is it famous?",
    "Summarise the rules of chess in two sentences.",
]


def max_rss_bytes() -> int:
    """High-water mark of this process's resident set, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Current resident set of this process in bytes, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_memory_bytes() -> int:
    """``MemAvailable`` from ``/proc/meminfo`` (what can still be allocated without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line; cannot check memory headroom")


def wait_for_memory(need_bytes: float, timeout_s: float = 1800, poll_s: float = 15,
                    log: Callable[[str], None] | None = None) -> bool:
    """Block until ``MemAvailable ≥ need_bytes`` (other users of a shared machine come and go).

    Returns True once enough memory is available, False after ``timeout_s`` without it.
    """
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        avail = available_memory_bytes()
        if avail >= need_bytes:
            return True
        if time.monotonic() >= deadline:
            return False
        if log is not None and not warned:
            log(f"waiting for memory: need {need_bytes / 1e9:.1f} GB, MemAvailable {avail / 1e9:.1f} GB")
            warned = True
        time.sleep(poll_s)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, result)`` of one call of ``fn`` (``time.perf_counter``)."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleaved_order(names: Sequence[str], repeats: int) -> Iterator[str]:
    """Yield ``names`` ``repeats`` times, rotating the start each round (A B, B A, A B, ...).

    Every name runs once per round, and across rounds each occupies each slot equally often,
    so neither drift in machine load nor "runs right after X" favours one configuration.
    """
    k = len(names)
    for r in range(repeats):
        for i in range(k):
            yield names[(r + i) % k]


def alternating_timings(fns: dict[str, Callable[[], Any]], repeats: int,
                        warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function, interleaved (:func:`interleaved_order`), in-process.

    ``warmup`` untimed rounds run first (kernel selection, lazy initialisation).
    """
    if repeats < 1:
        raise ValueError(f"alternating_timings: repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name in interleaved_order(list(fns), repeats):
        times[name].append(timed(fns[name])[0])
    return times


def summarise(samples: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max", "n"}`` of a non-empty list of numbers."""
    if not samples:
        raise ValueError("summarise: no samples")
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


#: The benchmarks' smoke tests (tests/benchmarks/test_smoke.py) set this: :func:`run_isolated` then calls
#: the function in this process (its result still goes through JSON), so that a script runs at its
#: smallest size without an interpreter start per sample. Its memory figures then mean nothing, and
#: the smoke runs measure nothing.
IN_PROCESS = False


def run_isolated(file: str | Path, func: str, kwargs: dict[str, Any], timeout_s: float = 3600,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``func(**kwargs)`` from ``file`` in a fresh Python process and return its dict.

    The child uses this interpreter and inherits the environment (plus ``env``). A non-zero
    exit, a timeout or a missing result line raises ``RuntimeError`` carrying the child's
    stderr tail, so a crashed configuration is never reported as a number. Under
    :data:`IN_PROCESS`, the same call in this process (torch's thread count and ``env`` restored after).
    """
    if IN_PROCESS:
        return _call_here(file, func, kwargs, env or {})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--call", f"{Path(file).resolve()}:{func}",
           "--kwargs", json.dumps(kwargs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO,
                          env={**os.environ, **(env or {})})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"isolated run {func}({kwargs}) failed with exit code {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def _call_here(file: str | Path, func: str, kwargs: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """:func:`run_isolated` under :data:`IN_PROCESS`: the child's call, in this process."""
    import torch

    threads, saved = torch.get_num_threads(), {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = getattr(_load_file(file), func)(**json.loads(json.dumps(kwargs)))
    finally:
        torch.set_num_threads(threads)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return json.loads(json.dumps(result))


def _load_file(file: str | Path):
    """Import ``file`` as a module of its own (what the child does), once per file."""
    name = f"_bench_child_{Path(file).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name]


#: The CPU features the kernels depend on, as /proc/cpuinfo names them: fp32 and int SIMD width
#: (AVX2, AVX-512), native bf16 dot products (AVX512-BF16) and Intel's matrix tiles (AMX).
CPU_FLAGS = {"AVX2": "avx2", "AVX-512": "avx512f", "AVX512-BF16": "avx512_bf16", "AMX-BF16": "amx_bf16"}


def cpu_flags() -> dict[str, bool]:
    """Which of :data:`CPU_FLAGS` this CPU has (all False where /proc/cpuinfo is unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            have = set(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), []))
    except OSError:
        have = set()
    return {name: flag in have for name, flag in CPU_FLAGS.items()}


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU and its flags, core count, load, torch version and thread count."""
    import torch

    from arlopti.utils.machine import cpu_id, cpu_name

    return {"cpu": cpu_name(), "cpu_id": cpu_id(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "load_avg_1_5_15": list(os.getloadavg()), "torch": torch.__version__,
            "torch_kernels": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version()}


def gemm_rate(n: int, dtype, reps: int) -> float:
    """Best FLOP/s of ``a @ b`` for ``n × n`` matrices of ``dtype`` (2·n³ FLOPs per product), after one
    untimed product, with torch's current thread count (:func:`arlopti.utils.machine.gemm_flops`, the one
    measurement a run's summary records too)."""
    from arlopti.utils.machine import gemm_flops

    return gemm_flops(n, reps, dtype)


def read_bandwidth(mib: int, reps: int) -> float:
    """Best bytes/s of ``x.sum()`` over an fp32 tensor of ``mib`` MiB (make it far larger than the
    last-level cache), after one untimed pass, with torch's current thread count: the rate at which
    the cores stream memory they only read, as a decoding step reads its weights."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Plain-text table; floats get 4 significant digits, missing cells print as ``-``."""
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(s.rjust(w) for s, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(b) for b in body)])


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus ``machine`` and the command line) to ``benchmarks/out/<name>``."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / name
    full = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine_info(), **payload}
    path.write_text(json.dumps(full, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------------------------
# Running our learner for a few rollout steps (bench_lopti_overhead, bench_microbatch, bench_mfu)
# ----------------------------------------------------------------------------------------------

def hf_engine_for(model_name: str, tokens: int, hidden: int = 256, layers: int = 4):
    """(HFEngine, tokenizer) on a fresh fp32 model whose completions are exactly ``tokens`` long:
    ``"tiny"`` is the ``bench_step`` model (random Qwen2, ``hidden`` × ``layers``), anything else
    goes through ``arlopti.models.loading`` (e.g. ``smollm2-135m-instruct``)."""
    import torch

    from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer, load_causal_lm, load_tokenizer
    from arlopti.rollout.hf import HFEngine

    torch.manual_seed(0)
    if model_name == "tiny":
        tok = build_tiny_tokenizer()
        model = build_tiny_model(tok, TinySpec(arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=4,
                                               num_kv_heads=2, intermediate_size=2 * hidden,
                                               tie_word_embeddings=True))
    else:
        tok = load_tokenizer(model_name)
        model = load_causal_lm(model_name, tok, dtype="float32")
    model.generation_config.min_new_tokens = tokens
    return HFEngine(model, tok, generation_batch_size=1024), tok


@contextlib.contextmanager
def saved_tiny_model(tokenizer, hidden: int, layers: int) -> Iterator[tuple[str, int]]:
    """A tiny random Qwen2 (``hidden`` × ``layers``, MLP 2 × hidden) saved with ``tokenizer`` to a temporary
    folder, so that every configuration of a benchmark loads the same weights: yields (folder, its parameter
    count); the folder is removed afterwards."""
    from arlopti.models.loading import TinySpec, build_tiny_model

    with tempfile.TemporaryDirectory() as model_dir:
        model = build_tiny_model(tokenizer, TinySpec(hidden_size=hidden, num_layers=layers,
                                                     intermediate_size=2 * hidden))
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        yield model_dir, n_params


def fixed_length_engine(tokenizer, lengths_of: Callable[[int, int], int], seed: int = 0):
    """A rollout engine returning fixed completions: prompt ``i``'s sample ``j`` has
    ``lengths_of(i, j)`` random non-special tokens drawn from ``Random((seed, prompt tokens, j))``,
    the same in every run whatever the weights ("the same batches" for A/B comparisons)."""
    import random

    from arlopti.rollout.engine import Completion, RolloutEngine

    specials = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in specials]

    class FixedLengths(RolloutEngine):
        def generate(self, prompt_ids, n, sampling):
            out = []
            for i, p in enumerate(prompt_ids):
                row = []
                for j in range(n):
                    rng = random.Random(f"{seed}/{list(p)}/{j}")
                    ids = [rng.choice(vocab) for _ in range(lengths_of(i, j))]
                    row.append(Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), "length"))
                out.append(row)
            return out

    return FixedLengths()


def bench_datamodule(tokenizer, prompts_per_step: int, n_steps: int, texts: Sequence[str] | None = None):
    """A PromptDataModule of ``prompts_per_step × n_steps`` fixed prompts, in order, for task
    ``bench`` (reward: distinct characters of the response mod 4, varied within a group)."""
    from arlopti.data.prompt_datamodule import PromptDataModule, PromptRecord
    from arlopti.tasks.base import RewardResult, Task, _TASKS, register_task

    class BenchTask(Task):
        name = "bench"

        def score(self, responses, ground_truths, metas):
            return [RewardResult(float(len(set(r)) % 4), False, {}) for r in responses]

    if "bench" not in _TASKS:
        register_task("bench")(BenchTask)
    n = prompts_per_step * n_steps
    texts = list(texts or [f"Zoey said that Oliver is a knight {i}. Is Oliver a knight or a knave?"
                           for i in range(n)])

    class DM(PromptDataModule):
        task_name = "bench"

        def train_records(self):
            return [PromptRecord(uid=f"bench/{i}", ground_truth=None, task="bench", text=texts[i % len(texts)])
                    for i in range(n)]

    return DM(tokenizer=tokenizer, prompts_per_step=prompts_per_step, max_prompt_length=512, shuffle=False)


def fit_steps(module, datamodule, group_size: int, precision: str = "32-true") -> list[dict[str, float]]:
    """``trainer.fit`` our ``GRPOModule`` over the datamodule's batches; per rollout step, return
    the learner's metrics plus ``step_s`` (wall time from before the rollout to after the
    update, measured by a callback that runs before the rollout callback)."""
    import lightning.pytorch as L

    from arlopti.callbacks.rollout import RolloutCallback

    out: list[dict[str, float]] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            out.append({**pl_module.last_step_context.metrics, "step_s": time.perf_counter() - self.t0})

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, precision=precision,
                        callbacks=[Timer(), RolloutCallback(group_size=group_size)])
    trainer.fit(module, datamodule=datamodule)
    return out


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="child side of benchmarks._common.run_isolated")
    parser.add_argument("--call", required=True, help="FILE:FUNC")
    parser.add_argument("--kwargs", default="{}")
    args = parser.parse_args(argv)
    file, func = args.call.rsplit(":", 1)
    result = getattr(_load_file(file), func)(**json.loads(args.kwargs))
    print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
