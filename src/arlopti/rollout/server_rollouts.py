"""``rollout.placement=server``: rollout workers that generate ahead of the trainer, within the bound.

:class:`ServerRollouts` is the third :class:`~arlopti.rollout.source.RolloutSource`. It owns the
workers (:class:`arlopti.rollout.server_client.RolloutWorker`), one background thread that generates
whole steps' episodes in order, and the queue of their futures. At the start of every training step
:meth:`ServerRollouts.collect` follows :func:`arlopti.rollout.async_plan.plan_step`: waits for what the
plan needs, sends the weights when it says so (every worker, bucket by bucket, tagged with the policy
version; what is sent is the weight publisher's plan, :mod:`arlopti.rollout.publisher`, with the name
check), queues the next batches (their prompts from ``ahead``:
:meth:`arlopti.data.prompt_datamodule.PromptDataModule.batch_ahead`), and returns step ``t``'s episodes,
each stamped with the version that generated it. A step's prompts are split between the workers in
contiguous, whole groups (a multi-turn episode's later turns: the episodes still running, split the
same way; :mod:`arlopti.rollout.turns` runs here over the pooled workers, token ids over the route
both ways). With ``rollout.server.check_sync`` every sync is followed by a probe: a worker
samples a few tokens of the step's first prompt with their log-probs, and the trainer's own log-probs
of the same tokens must agree within ``rollout.server.sync_check_tol`` (:func:`check_worker_agrees`).

Seeds are the colocated engine's (:class:`~arlopti.rollout.source.SamplingPlan`: the step seed from
``rollout.seed``, the step and the rank; one seed per response), so with ``max_staleness = 0`` the
tokens are those of ``placement=colocated``.

Several trainer ranks (DDP, FSDP2): every rank drives its own workers with its own share of the
batch (its prompts, its seeds) and takes the same plan at the same steps, so their syncs, whose
FSDP2 gathers are collectives, run in lockstep. A worker fault then stops the run (a restart on one
rank would re-sync on that rank alone).

Faults (all handled here, on the trainer's thread): a :class:`~arlopti.rollout.server_client.WorkerError`
from a batch or a sync drops every queued batch, restarts the failed worker if this trainer spawned it
and it has restarts left (``rollout.server.max_restarts``), re-syncs every worker to the current
version and regenerates (staleness only drops). A worker started by the user, one out of restarts, or
one whose restart fails stops the run with :class:`RolloutWorkersLost` naming it; the rollout callback
saves ``last.ckpt`` first and says where (no step that was trained is lost). A spawned worker's
supervisor that exits while the run goes on is warned about within a second, and what is left of its
process group is killed (:meth:`ServerRollouts._watch_supervisors`). :meth:`close` stops every
spawned worker.

Measured per step (``async/*``, docs/metrics.md): the trainer's wait, each worker's idle time and
tokens/s, the queue depth, sync time and the number of restarts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from arlopti.models.lora import base_identity, base_model_of
from arlopti.rollout.async_plan import plan_step
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.episode import Episode
from arlopti.rollout.publisher import WeightPublisher, head_untied_for_lora
from arlopti.rollout.server_client import RolloutWorker, WorkerError, served_model_name
from arlopti.rollout.source import Collected, RolloutSource, SamplingPlan, collect_groups
from arlopti.rollout.vllm_startup import resolve_dtype

log = logging.getLogger(__name__)


class RolloutWorkersLost(RuntimeError):
    """The run cannot go on with its rollout workers (a fault that is not restarted); the message names
    the worker and why. The rollout callback saves a checkpoint first where it can."""


@dataclass
class Batch:
    """One step's generation: its prompts, the version generating it, and its result when done."""

    step: int
    prompts: object  # PromptBatch
    version: int
    future: Future
    stats: dict = field(default_factory=dict)


class ServerRollouts(RolloutSource):
    """See the module docstring. Built by :meth:`start`."""

    def __init__(self, workers: list[RolloutWorker], rollout_cfg, base_name: str, tokenizer, group_size: int,
                 world: int = 1, sampling: SamplingPlan | None = None, publisher: WeightPublisher | None = None,
                 wire_dtype: torch.dtype = torch.float32):
        super().__init__(group_size, sampling or SamplingPlan.of(rollout_cfg))
        self.workers = workers
        self.world = world  # trainer ranks: each drives its own workers, in lockstep (module docstring)
        self.cfg = rollout_cfg
        self.base_name = base_name
        self.tokenizer = tokenizer
        self.publisher = publisher
        self.wire_dtype = wire_dtype
        self.run = ""  # this run's name, as a worker that refuses a second run tells it
        self.queue: dict[int, Batch] = {}
        self.last_scheduled = -1
        self.version: int | None = None
        self.restarts = 0
        self._gen = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arlopti-rollout")
        # one thread per request in flight (one request per response): the whole step reaches vLLM's scheduler
        self._http = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="arlopti-http")
        self._idle_since = time.perf_counter()
        self._idle_s = 0.0
        self._closed = threading.Event()
        self._gone_supervisors: set[int] = set()
        self._supervisor_lock = threading.Lock()
        threading.Thread(target=self._watch_supervisors, name="arlopti-worker-watch", daemon=True).start()

    # ------------------------------------------------------------------ building
    @classmethod
    def start(cls, model_cfg, rollout_cfg, policy, tokenizer, group_size: int, run_dir: Path,
              rank: int = 0, world: int = 1) -> "ServerRollouts":
        """Spawn or connect to this trainer rank's workers (``rollout.server``: ``num_workers`` spawned per
        rank, or rank ``r``'s contiguous share of ``urls``) and check each one's base model against the
        policy's, taken now (before any weight is trained or restored)."""
        s = rollout_cfg.server
        identity = base_identity(base_model_of(policy))
        if s.spawn:
            first = rank * s.num_workers
            workers = [RolloutWorker.spawn(first + i, model_cfg, rollout_cfg, run_dir) for i in range(s.num_workers)]
        else:
            share = len(s.urls) // world
            workers = [RolloutWorker.remote(u, s) for u in s.urls[rank * share:(rank + 1) * share]]
        wire = resolve_dtype(rollout_cfg.dtype, next(p.dtype for p in policy.parameters() if p.is_floating_point()))
        pool = cls(workers, rollout_cfg, served_model_name(identity, head_untied_for_lora(policy)), tokenizer,
                   group_size, world, SamplingPlan.of(rollout_cfg, rank),
                   WeightPublisher.for_policy(policy, rollout_cfg.lora_sync), wire)
        pool.run = f"{Path(run_dir).parent} (rank {rank}, pid {os.getpid()} on {socket.gethostname()})"
        try:
            for w in workers:  # spawned ones start together; each is then waited for
                if w.spawned:
                    w.launch()
            for w in workers:
                if w.spawned:
                    w.wait_ready(s.startup_timeout_s, "rollout.server.startup_timeout_s")
                else:
                    w.wait_ready(s.timeout_s, "rollout.server.timeout_s")
                w.check_base(pool.base_name)
                w.start_transfer(pool.run)
        except BaseException:
            pool.close()
            raise
        return pool

    # ------------------------------------------------------------------ the step
    def collect(self, policy, version, step, prompts, *, round_index=0, ahead=None) -> Collected:
        """Step ``step``'s episodes of ``prompts`` (this step's batch from the loader), each stamped with the
        version that generated it, and the step's ``async/*`` statistics. ``ahead(j)``: the batch ``j``
        steps later (required: the workers generate ahead)."""
        if round_index != 0:
            raise ValueError("rollout.placement=server generates one round per step (DAPO dynamic sampling "
                             "is refused with it at start-up)")
        if ahead is None:
            raise ValueError("rollout.placement=server needs the batches ahead (a PromptDataModule's batch_ahead)")
        stats = {"trainer_wait_s": 0.0, "sync_s": 0.0}
        for attempt in range(self._max_attempts()):
            try:
                groups, stats = self._collect(policy, step, prompts, ahead, stats)
                return Collected(groups, {"rollout_s": stats["trainer_wait_s"], "sync_s": stats["sync_s"]}, stats)
            except WorkerError as err:
                self._recover(err, attempt)
        raise AssertionError("unreachable")

    def _max_attempts(self) -> int:
        return 1 + self.cfg.server.max_restarts * max(1, len(self.workers))

    def _collect(self, policy, step, prompts, ahead, stats):
        if self.last_scheduled < step - 1:
            self.last_scheduled = step - 1  # nothing queued (first step, resume, restart): start from here
        plan = plan_step(step, self.version, self.last_scheduled, self.cfg.async_.max_staleness,
                         self.cfg.server.sync_every)
        if plan.sync:
            stats["trainer_wait_s"] += self._drain()
            t0 = time.perf_counter()
            self._sync(policy, plan.version, prompts.prompt_ids[0])
            stats["sync_s"] = time.perf_counter() - t0
        for s in plan.schedule:
            batch = prompts if s == step else ahead(s - step)
            if batch is None:  # past the run's last step: nothing to generate there
                break
            self._queue(s, batch, self.sampling.at(s))
        stats["queue_depth"] = float(len(self.queue))
        batch = self.queue.pop(step)
        self._check_prompts(batch, prompts)
        t0 = time.perf_counter()
        groups = batch.future.result()
        stats["trainer_wait_s"] += time.perf_counter() - t0
        stats.update(batch.stats, worker_idle_s=self._take_idle(), restarts=float(self.restarts),
                     policy_version=float(batch.version))
        return groups, stats

    def _sync(self, policy, version: int, probe_prompt: list[int]) -> None:
        """Send every worker the publisher's plan as ``version`` (then, with ``check_sync``, probe it)."""
        bucket = int(self.cfg.sync_bucket_mb) * 2**20 or 1
        for w in self.workers:
            plan = self.publisher.plan(policy, holds_base=w.version is not None)
            if plan.adapter:
                raise WorkerError(w.name, "rollout.lora_sync=adapter is not served by rollout workers")
            w.sync(plan.items, bucket, self.wire_dtype, version)
        self.version = version
        if self.cfg.server.check_sync:
            for w in self.workers:
                check_worker_agrees(w, policy, probe_prompt, self.cfg.temperature, self.cfg.server.sync_check_tol,
                                    self._http, self.tokenizer)

    def _queue(self, step: int, prompts, sampling: SamplingConfig) -> None:
        version = self.version
        b = Batch(step, prompts, version, Future())
        b.future = self._gen.submit(self._generate, b, sampling)
        self.queue[step] = b
        self.last_scheduled = step

    def _generate(self, b: Batch, sampling: SamplingConfig) -> list[list[Episode]]:
        """Runs on the generation thread: the step's episodes, every generation call split between the
        workers in parallel (:meth:`_pooled`)."""
        start = time.perf_counter()
        self._idle_s += start - self._idle_since
        tally: dict[int, list[float]] = {}  # worker -> [tokens, seconds] over the step's calls

        def generate(ids, n, s):
            return self._pooled(ids, n, s, tally)

        out = collect_groups(generate, list(b.prompts.prompt_ids), self.group_size, sampling, b.version,
                             turns=self.turns, batch=b.prompts)
        self._idle_since = time.perf_counter()
        for i, (tokens, seconds) in sorted(tally.items()):
            b.stats[f"worker{i}/tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
        b.stats["generate_s"] = self._idle_since - start
        return out

    def _pooled(self, ids: list[list[int]], n: int, sampling: SamplingConfig, tally: dict) -> list:
        """``n`` completions of each of ``ids``, the prompts split between the workers in contiguous whole
        groups (worker i's prompt k is prompt ``lo_i + k`` of the call: its seeds); adds each worker's
        tokens and wall seconds to ``tally``."""
        chunks = _split(len(ids), len(self.workers))
        with ThreadPoolExecutor(max_workers=len(self.workers)) as per_worker:
            futs = {i: per_worker.submit(self._timed, w, ids[lo:hi], lo, n, sampling)
                    for i, (w, (lo, hi)) in enumerate(zip(self.workers, chunks)) if hi > lo}
            parts = {i: f.result() for i, f in futs.items()}
        out: list = []
        for i, (groups, tokens, seconds) in parts.items():  # in worker order: the call's prompt order
            out += groups
            t = tally.setdefault(i, [0.0, 0.0])
            t[0], t[1] = t[0] + tokens, t[1] + seconds
        return out

    def _timed(self, worker: RolloutWorker, prompts, first: int, n: int, sampling: SamplingConfig):
        t0 = time.perf_counter()
        groups = worker.generate(prompts, first, n, sampling, self.tokenizer, self._http)
        return groups, sum(len(c.token_ids) for g in groups for c in g), time.perf_counter() - t0

    def _drain(self) -> float:
        """Wait for every queued batch to finish generating (a sync changes weights between batches)."""
        t0 = time.perf_counter()
        for b in list(self.queue.values()):
            b.future.exception()  # waits; a failure is raised when the batch is taken (or by _recover)
        for b in self.queue.values():
            if b.future.exception() is not None:
                raise b.future.exception()
        return time.perf_counter() - t0

    def _take_idle(self) -> float:
        idle, self._idle_s = self._idle_s, 0.0
        return idle

    @staticmethod
    def _check_prompts(batch: Batch, prompts) -> None:
        if list(batch.prompts.prompt_ids) != list(prompts.prompt_ids):
            raise RuntimeError(f"the batch generated ahead for step {batch.step} holds other prompts than the "
                               "loader's: the data order is not the one PromptDataModule.batch_ahead predicts "
                               "(a custom sampler?); use rollout.async.max_staleness=0")

    # ------------------------------------------------------------------ faults
    def _recover(self, err: WorkerError, attempt: int) -> None:
        """Drop the queue, restart the failed worker (or stop the run), and force a re-sync."""
        for b in self.queue.values():
            b.future.cancel()
        for b in self.queue.values():
            if not b.future.cancelled():
                b.future.exception()
        self.queue.clear()
        self.last_scheduled = -1
        self.version = None  # every worker gets the current weights again
        self._stop_orphaned_groups()  # a fault may be seen before the watcher's next look: say why now
        worker = next((w for w in self.workers if w.name == getattr(err, "worker", None)), None)
        if worker is None or not worker.spawned:
            raise RolloutWorkersLost(f"{err}. It was started separately (rollout.server.urls): restart it with "
                                     "python -m arlopti.rollout.serve, then resume the run.") from err
        if self.world > 1:  # the other ranks would not re-sync with it: their weight gathers would not match
            raise RolloutWorkersLost(f"{err}. With {self.world} trainer ranks a worker is not restarted (every "
                                     "rank's sync gathers the weights together): the run stops.") from err
        if worker.restarts >= self.cfg.server.max_restarts:
            raise RolloutWorkersLost(f"{err}. It was restarted {worker.restarts} time(s) already "
                                     f"(rollout.server.max_restarts={self.cfg.server.max_restarts}); its log: "
                                     f"{worker.spawn_args['log']}") from err
        log.warning("%s; restarting it (%d of at most %d)", err, worker.restarts + 1, self.cfg.server.max_restarts)
        self._restart(worker, err)

    def _restart(self, worker: RolloutWorker, err: WorkerError) -> None:
        """Start ``worker`` again and connect it; a restart that fails (it does not come up, or answers
        wrongly) stops the run as :class:`RolloutWorkersLost`, so that its steps are saved first."""
        worker.stop(grace_s=2.0)
        worker.restarts += 1
        self.restarts += 1
        try:
            worker.launch()
            worker.wait_ready(self.cfg.server.startup_timeout_s, "rollout.server.startup_timeout_s")
            worker.check_base(self.base_name)
            worker.start_transfer(self.run)
        except WorkerError as again:
            raise RolloutWorkersLost(f"{err}. Restarting it failed: {again}") from again

    def _watch_supervisors(self, every_s: float = 1.0) -> None:
        """Every second, :meth:`_stop_orphaned_groups` (the fault path also calls it, so a failed request
        that comes first does not hide why)."""
        while not self._closed.wait(every_s):
            self._stop_orphaned_groups()

    def _stop_orphaned_groups(self) -> None:
        """A spawned worker's supervisor that exited (killed, crashed) while this trainer did not stop it
        takes its whole process group with it now, and says so once (the next request then fails and the
        worker is restarted or the run stops, as for any fault)."""
        with self._supervisor_lock:
            for w in self.workers:
                proc = w.process
                if proc is None or proc.pid in self._gone_supervisors or proc.poll() is None:
                    continue
                self._gone_supervisors.add(proc.pid)
                log.warning("rollout %s: its supervisor (pid %d, python -m arlopti.rollout.serve) exited with "
                            "status %s while the run goes on; stopping what is left of its process group (at its "
                            "next request the worker is restarted if rollout.server.max_restarts allows, else the "
                            "run saves its steps and stops)", w.name, proc.pid, proc.returncode)
                w.kill_group(proc.pid)

    def close(self) -> None:
        self._closed.set()
        for b in self.queue.values():
            b.future.cancel()
        self.queue.clear()
        self._gen.shutdown(wait=False, cancel_futures=True)
        self._http.shutdown(wait=False, cancel_futures=True)
        for w in self.workers:
            w.stop()


@torch.no_grad()
def check_worker_agrees(worker: RolloutWorker, policy, prompt: list[int], temperature: float, tol: float, pool,
                        tokenizer, tokens: int = 8) -> float:
    """Sample ``tokens`` tokens of ``prompt`` on ``worker`` with their log-probs and compare them with the
    trainer's log-probs of the same tokens at the same temperature; raises beyond ``tol``. Returns the
    largest difference."""
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=tokens, seed=0, logprobs=True)
    (group,) = worker.generate([prompt], 0, 1, sampling, tokenizer, pool)
    c = group[0]
    device = next(policy.parameters()).device
    ids = torch.tensor([list(prompt) + c.token_ids], device=device)
    logp = policy(ids, torch.ones_like(ids), len(prompt), temperature)
    logp = logp[0] if isinstance(logp, tuple) else logp
    gap = float((logp[0, :len(c.token_ids)].float().cpu() - torch.tensor(c.logprobs)).abs().max())
    if not gap <= tol:
        raise WorkerError(worker.name, f"after the sync to version {worker.version} its log-probs differ from the "
                                       f"trainer's by up to {gap:.3g} > rollout.server.sync_check_tol={tol}: the "
                                       "weights did not arrive intact")
    log.info("%s agrees with the trainer after the sync to version %s (max |dlogp| %.2g)", worker.name,
             worker.version, gap)
    return gap


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(n)``, sizes differing by at most one."""
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


__all__ = ["RolloutWorkersLost", "ServerRollouts", "check_worker_agrees"]
