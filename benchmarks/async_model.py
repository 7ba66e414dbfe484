"""What overlapping generation with the update gives: a MODEL (arithmetic), not a measurement.

Issue 27: "from the measured generation and update times, model what the overlap gives at GPU scale,
e.g. a 7B run on 4 + 4 GPUs with generation at 70% of a synchronous step".

The step time of one rollout step, in the steady state (``rollout.server.sync_every = 1``; the rule
of ``arlopti/rollout/async_plan.py``):

* synchronous (``placement=colocated``, or ``server`` with ``k = 0``)::

      T_sync = G + S + U + O

* overlapped (``server`` with ``k >= 1``): the worker generates step t+1's batch while the trainer
  updates on step t's; the weight transfer stops both (a sync drains the batches in flight and the
  worker does not generate while it loads weights), so::

      T_async = max(G, U) + S + O

with ``G`` the generation time of one step's batch, ``U`` the trainer's time (log-probs + update),
``S`` the weight sync and ``O`` the rest of the step (scoring, logging). Throughput is ``1 / T``;
a larger ``k`` does not change the steady state (it absorbs uneven generation times).

GPU scale (:func:`gpu_rows`): a synchronous colocated step on ``n`` GPUs, normalised to ``T0``
seconds, with generation a share ``gen_frac`` of it: ``G_n = gen_frac * T0``,
``U_n = (1 - gen_frac) * T0``, ``S_n`` the colocated engine's in-GPU reload (``colocated_sync_s``).
Splitting into ``n_gen`` rollout GPUs and ``n_train`` trainer GPUs::

      G = G_n * (n / n_gen) ** a        U = U_n * (n / n_train) ** b
      S = params * wire_bytes / bandwidth

``a = b = 1``: generation and update scale linearly with GPUs (throughput-bound: a data-parallel
rollout fleet, FSDP); ``a < 1``: generation is partly latency-bound (the longest response of the
step sets its end whatever the number of GPUs), so taking GPUs away from it costs less than linear.

CPU check (:func:`cpu_rows`): the same formulas fed with this machine's measured ``G``, ``U``, ``S``,
``O`` (``benchmarks/out/bench_async.json`` of ``benchmarks/bench_async.py``: ``G`` = the trainer's
wait at ``k = 0``, which is the whole generation; ``O`` = the ``k = 0`` step time not in G, U, S),
and the predicted ratios against colocated next to the measured ones.

Usage: ``python benchmarks/async_model.py [--bench benchmarks/out/bench_async.json]`` (no GPU, no vLLM).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

LABEL = "MODEL, not a measurement"


def sync_step_s(gen: float, update: float, sync: float, other: float = 0.0) -> float:
    """``T_sync = G + S + U + O``."""
    return gen + sync + update + other


def overlapped_step_s(gen: float, update: float, sync: float, other: float = 0.0, k: int = 1) -> float:
    """``T_async = max(G, U) + S + O`` for ``k >= 1``; ``k = 0`` is :func:`sync_step_s`."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0:
        return sync_step_s(gen, update, sync, other)
    return max(gen, update) + sync + other


def scaled_s(seconds: float, gpus_from: int, gpus_to: int, exponent: float) -> float:
    """``seconds * (gpus_from / gpus_to) ** exponent``: a phase moved from ``gpus_from`` to ``gpus_to``."""
    if gpus_from < 1 or gpus_to < 1:
        raise ValueError(f"GPU counts must be >= 1, got {gpus_from} -> {gpus_to}")
    return seconds * (gpus_from / gpus_to) ** exponent


def fitted_exponent(t_few: float, t_many: float, n_few: int, n_many: int) -> float:
    """The exponent ``e`` with ``t_few = t_many * (n_many / n_few) ** e`` (inverse of :func:`scaled_s`):
    ``log(t_few / t_many) / log(n_many / n_few)``."""
    return math.log(t_few / t_many) / math.log(n_many / n_few)


def transfer_s(params: float, wire_bytes: float, gb_per_s: float) -> float:
    """Seconds to send ``params`` parameters of ``wire_bytes`` bytes each at ``gb_per_s`` GB/s (1e9 B)."""
    return params * wire_bytes / (gb_per_s * 1e9)


@dataclass(frozen=True)
class GpuAssumptions:
    """Every input of the GPU-scale model (printed as its assumptions table)."""

    params: float = 7.62e9  # Qwen2.5-7B (docs/scaling.md memory table)
    wire_bytes: float = 2.0  # bf16 on the wire (rollout.dtype=bfloat16)
    gb_per_s: float = 5.0  # gloo over TCP with CPU staging: an assumed effective 5 GB/s (40 Gbit/s)
    gpus: int = 8  # colocated: generation and update each on all 8
    n_gen: int = 4
    n_train: int = 4
    sync_step_s: float = 300.0  # T0: an assumed synchronous colocated step (long-CoT 7B scale)
    gen_frac: float = 0.7  # generation's share of T0 (the example)
    colocated_sync_s: float = 0.0  # in-GPU weight reload of the colocated engine, assumed free (favours colocated)
    update_exponent: float = 1.0  # b: FSDP update time ~ 1 / GPUs


def gpu_rows(a: GpuAssumptions, gen_exponents=(1.0, 0.5, 0.0), ks=(0, 1)) -> list[dict]:
    """Steps per hour and the ratio against colocated for each generation-scaling exponent and k."""
    t0 = a.sync_step_s
    g_n, u_n = a.gen_frac * t0, (1.0 - a.gen_frac) * t0
    colocated = sync_step_s(g_n, u_n, a.colocated_sync_s)
    s = transfer_s(a.params, a.wire_bytes, a.gb_per_s)
    rows = [{"setup": f"colocated on {a.gpus}", "gen_exponent": None, "k": 0, "gen_s": g_n, "update_s": u_n,
             "sync_s": a.colocated_sync_s, "step_s": colocated, "steps_per_hour": 3600 / colocated,
             "vs_colocated": 1.0}]
    for exp in gen_exponents:
        g = scaled_s(g_n, a.gpus, a.n_gen, exp)
        u = scaled_s(u_n, a.gpus, a.n_train, a.update_exponent)
        for k in ks:
            step = overlapped_step_s(g, u, s, k=k)
            rows.append({"setup": f"server {a.n_gen} + {a.n_train}", "gen_exponent": exp, "k": k, "gen_s": g,
                         "update_s": u, "sync_s": s, "step_s": step, "steps_per_hour": 3600 / step,
                         "vs_colocated": colocated / step})
    return rows


def best_split(a: GpuAssumptions, gen_exponent: float) -> tuple[int, float]:
    """The rollout-GPU count ``n_gen`` (1 .. gpus-1, the rest train) with the shortest ``k >= 1`` step,
    and that step's ratio against colocated."""
    colocated = sync_step_s(a.gen_frac * a.sync_step_s, (1 - a.gen_frac) * a.sync_step_s, a.colocated_sync_s)
    s = transfer_s(a.params, a.wire_bytes, a.gb_per_s)

    def step(n_gen: int) -> float:
        g = scaled_s(a.gen_frac * a.sync_step_s, a.gpus, n_gen, gen_exponent)
        u = scaled_s((1 - a.gen_frac) * a.sync_step_s, a.gpus, a.gpus - n_gen, a.update_exponent)
        return overlapped_step_s(g, u, s, k=1)

    n = min(range(1, a.gpus), key=step)
    return n, colocated / step(n)


def cpu_rows(bench: dict) -> list[dict]:
    """Predicted vs measured steps per hour on this machine, from ``bench_async.json``'s summary."""
    by = {r["config"]: r for r in bench["summary"]}
    if "colocated" not in by or "server_k0" not in by:
        raise ValueError("bench_async.json needs the colocated and server_k0 rows")
    k0 = by["server_k0"]
    gen, upd, sync = k0["rollout_s"], k0["update_s"] + k0["logprobs_s"], k0["sync_s"]
    other = max(0.0, k0["step_s"] - sync_step_s(gen, upd, sync))
    colocated = by["colocated"]["step_s"]
    rows = []
    for name, r in by.items():
        if not name.startswith("server_k"):
            continue
        k = int(name[len("server_k"):])
        pred = overlapped_step_s(gen, upd, sync, other, k=k)
        rows.append({"config": name, "gen_s": gen, "update_s": upd, "sync_s": sync, "other_s": other,
                     "predicted_step_s": pred, "measured_step_s": r["step_s"],
                     "predicted_vs_colocated": colocated / pred, "measured_vs_colocated": r["vs_colocated"]})
    return rows


def cpu_exponents(bench: dict) -> list[dict]:
    """This CPU's own scaling exponents from 2 cores (colocated) to 1 (server_k0): the ``a`` and ``b``
    of the GPU model, measured for generation (the trainer's wait) and for log-probs + update."""
    by = {r["config"]: r for r in bench["summary"]}
    col, k0 = by["colocated"], by["server_k0"]
    phases = {"generation": (k0["rollout_s"], col["rollout_s"]),
              "log-probs + update": (k0["update_s"] + k0["logprobs_s"], col["update_s"] + col["logprobs_s"])}
    return [{"phase": name, "s_on_1_core": one, "s_on_2_cores": two, "exponent": fitted_exponent(one, two, 1, 2)}
            for name, (one, two) in phases.items()]


def _md(rows: list[dict], cols: list[str]) -> str:
    def cell(v):
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    return "\n".join(["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols),
                      *("| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows)])


def report(a: GpuAssumptions, bench: dict | None) -> str:
    """The markdown printed by ``main``: assumptions, the GPU model, the best split, the CPU check."""
    s = transfer_s(a.params, a.wire_bytes, a.gb_per_s)
    parts = [f"## {LABEL}: assumptions", _md([{"assumption": k, "value": v} for k, v in asdict(a).items()]
                                              + [{"assumption": "derived: weight transfer s", "value": s}],
                                              ["assumption", "value"]),
             f"\n## {LABEL}: 7B, colocated on {a.gpus} vs server on {a.n_gen} + {a.n_train}",
             _md(gpu_rows(a), ["setup", "gen_exponent", "k", "gen_s", "update_s", "sync_s", "step_s",
                               "steps_per_hour", "vs_colocated"]),
             f"\n## {LABEL}: best split of {a.gpus} GPUs at k >= 1 (at exponent 0 any split with enough "
             "trainer GPUs ties: generation would not depend on its GPUs at all)",
             _md([{"gen_exponent": e, "n_gen": n, "n_train": a.gpus - n, "vs_colocated": r}
                  for e in (1.0, 0.5) for n, r in [best_split(a, e)]],
                 ["gen_exponent", "n_gen", "n_train", "vs_colocated"])]
    if bench is not None:
        parts += [f"\n## {LABEL} checked on this CPU: predicted from the k=0 run's G, U, S, O vs measured "
                  "(bench_async.json)",
                  _md(cpu_rows(bench), ["config", "gen_s", "update_s", "sync_s", "other_s", "predicted_step_s",
                                        "measured_step_s", "predicted_vs_colocated", "measured_vs_colocated"]),
                  "\nThis CPU's scaling exponents, 2 cores (colocated) -> 1 core (server_k0), measured:",
                  _md(cpu_exponents(bench), ["phase", "s_on_1_core", "s_on_2_cores", "exponent"])]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default=str(Path(__file__).resolve().parent / "out" / "bench_async.json"),
                   help="bench_async.py's JSON (skipped when absent)")
    p.add_argument("--gen-frac", type=float, default=GpuAssumptions.gen_frac)
    p.add_argument("--gb-per-s", type=float, default=GpuAssumptions.gb_per_s)
    p.add_argument("--step-s", type=float, default=GpuAssumptions.sync_step_s)
    args = p.parse_args(argv)
    a = GpuAssumptions(gen_frac=args.gen_frac, gb_per_s=args.gb_per_s, sync_step_s=args.step_s)
    path = Path(args.bench)
    print(report(a, json.loads(path.read_text()) if path.exists() else None))


if __name__ == "__main__":
    main()
