"""LoRA adapters on the policy (``model.lora``), with peft.

``model.lora.r > 0`` wraps the loaded causal LM in a ``peft.PeftModel``: every targeted linear
layer ``W`` becomes ``W x + (alpha / r) · B A x`` with ``A [r, in]`` (Kaiming-uniform) and
``B [out, r]`` (zeros), so the adapted model starts equal to the base (Hu et al. 2021, eq. 3;
peft ``tuners/lora/layer.py``, ``LoraLayer.update_layer``). Only ``A``, ``B`` and the
``modules_to_save`` copies require grad; the optimizer sees nothing else
(``GRPOModule.configure_optimizers`` takes the trainable parameters).

What LoRA changes elsewhere, each in one place:

* the reference model is the base itself: :func:`adapters_disabled` runs the policy with the
  adapters off (``PeftModel.disable_adapter``), so no second copy is loaded;
* checkpoints keep only the trainable tensors (:func:`drop_frozen_weights`, a ``state_dict``
  post-hook) and the base model's identity (:func:`base_identity`), checked on resume;
* the vLLM sync sends merged weights or the adapter (:mod:`arlopti.rollout.lora_sync`);
* export writes a PEFT adapter folder or merged weights (:mod:`arlopti.checkpoints.export`);
* activation checkpointing (``model.lora.activation_checkpointing``): with the base frozen, a LoRA
  update's memory is mostly the activations autograd keeps, so each decoder layer can be recomputed
  in the backward instead (:class:`AutoCheckpointing` decides per training micro-batch under ``null``).

Tied embeddings (the tiny model, SmolLM2, Qwen2.5-0.5B/1.5B/3B: the LM head *is* the embedding
matrix). peft adapts a module, not a tensor: an adapter on ``embed_tokens`` (or a
``modules_to_save`` copy of it) changes the input side only, and the trainer's LM head stays the
frozen base matrix. Every consumer that folds the adapter into the weights (a merge, vLLM's merged
sync, a tied engine) would otherwise write it into the head too: 16.9 nats off the trained policy.
So :func:`untie_adapted_embedding` gives such a policy its own copy of the head before peft wraps
it and marks the config untied; the merged export, ``eval.py`` and vLLM then hold exactly the
model the trainer trains. The LM head itself cannot be adapted: the log-prob path multiplies by
its weight directly (:mod:`arlopti.ops.logprobs`), and :func:`check_not_the_head` refuses it.

Nothing else: the learner's objective, phases and normalisers are parameter-agnostic.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator

import torch
from torch import nn

from arlopti.config import ConfigError, LoraConfig

log = logging.getLogger(__name__)

#: ``target_modules: [all-linear]``: every linear layer of a Qwen2 / Llama decoder block (attention
#: projections and the gated MLP), not the LM head — the set TRL's and verl's LoRA examples use.
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR_NAME = "all-linear"


def lora_enabled(lora: LoraConfig | None) -> bool:
    """``model.lora.r`` of 0 or null means full-parameter training."""
    return lora is not None and bool(lora.r)


def lora_alpha(lora: LoraConfig) -> float:
    """``model.lora.alpha``, or 2 · r when null."""
    return float(lora.alpha) if lora.alpha is not None else 2.0 * float(lora.r)


def linear_leaf_names(model: nn.Module) -> list[str]:
    """The distinct leaf names of the model's ``nn.Linear`` layers (what ``target_modules`` names)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def module_leaf_names(model: nn.Module) -> list[str]:
    """The distinct leaf names of every module with parameters of its own, the LM head left out (what
    ``modules_to_save`` can name)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if name and m is not head and any(True for _ in m.parameters(recurse=False))})


def _matches(name: str, entry: str) -> bool:
    """peft's suffix rule: ``entry`` names the module ``name`` when equal or a ``.``-separated suffix."""
    return name == entry or name.endswith("." + entry)


def _covers(name: str, entry: str) -> bool:
    """Whether ``entry`` names the module ``name`` or one holding it (``model`` covers ``model.embed_tokens``)."""
    parts = name.split(".")
    return any(_matches(".".join(parts[:i]), entry) for i in range(1, len(parts) + 1))


def resolve_targets(model: nn.Module, targets: list[str], key: str = "model.lora.target_modules") -> list[str]:
    """Expand ``all-linear`` and check every entry matches a module of ``model``.

    An entry matches a module whose full name equals it or ends with ``.<entry>`` (peft's
    suffix rule). An entry that matches nothing is an error naming ``key`` and listing the names it
    could take (the linear layers for ``target_modules``, every module for ``modules_to_save``).
    """
    if not targets:
        raise ConfigError(f"{key} is empty: name the layers to adapt, e.g. [all-linear] or [q_proj, v_proj]")
    names = [n for n, _ in model.named_modules()]
    out: list[str] = []
    for entry in targets:
        wanted = [t for t in ALL_LINEAR if any(n.endswith("." + t) for n in names)] if entry == ALL_LINEAR_NAME \
            else [entry]
        for t in wanted:
            if not any(_matches(n, t) for n in names):
                kind, known = (("linear layers", linear_leaf_names(model)) if key.endswith("target_modules")
                               else ("modules", module_leaf_names(model)))
                raise ConfigError(f"{key}: {entry!r} matches no module of {type(model).__name__}; its {kind} "
                                  f"are named {known}")
            if t not in out:
                out.append(t)
    if not out:
        raise ConfigError(f"{key}=[{ALL_LINEAR_NAME}]: {type(model).__name__} has none of "
                          f"{list(ALL_LINEAR)}; name its layers instead: {linear_leaf_names(model)}")
    return out


def saved_module_names(model: nn.Module, entries: list[str]) -> list[str]:
    """The full names of the modules ``model.lora.modules_to_save`` names, by the dotted-suffix rule
    (:func:`_matches`: ``norm`` is ``model.norm``, not ``input_layernorm``).

    peft matched these entries by a plain name suffix before 0.22 (``norm`` took every ``*norm`` layer) and
    by a dotted one since. Handed full names, both rules take the same modules, so every peft in
    pyproject.toml's range trains the same copies; checked here, since a name that is a plain suffix of
    another module's would break that."""
    names = [n for n, _ in model.named_modules() if n]
    saved = [n for n in names if any(_matches(n, e) for e in entries)]
    for full in saved:
        others = [n for n in names if n not in saved and n.endswith(full)]
        if others:
            raise ConfigError(f"model.lora.modules_to_save: {full!r} is also a name suffix of {others}, which "
                              "peft before 0.22 would train too; name a module whose name is no other's suffix")
    return saved


def _names_of(model: nn.Module, module: nn.Module | None) -> list[str]:
    return [n for n, m in model.named_modules(remove_duplicate=False) if module is not None and m is module]


def check_not_the_head(model: nn.Module, entries: list[str], key: str) -> None:
    """Refuse an entry of ``key`` that names the LM head (or a module holding it): the log-prob path
    multiplies by the head's weight directly, so an adapter or a trained copy there would never be
    used by the trainer (and peft's wrapper is no ``nn.Linear``)."""
    heads = _names_of(model, model.get_output_embeddings())
    for entry in entries:
        for head in heads:
            if _covers(head, entry):
                raise ConfigError(
                    f"{key}: {entry!r} names the LM head ({head}); it cannot be adapted or trained as a copy, "
                    "because the log-prob path multiplies by the head's weight directly. Leave it out"
                    + (" (its weight is the embedding's: adapting embed_tokens trains the input side)"
                       if tied_embeddings(model) else ""))


def tied_embeddings(model: nn.Module) -> bool:
    """Whether the LM head's weight is the input embedding's (one tensor)."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and emb is not None and head.weight is emb.weight


def untie_adapted_embedding(model: nn.Module, lora: LoraConfig) -> bool:
    """Give the LM head its own copy of a tied embedding matrix when ``lora`` adapts the embedding
    (``target_modules`` or ``modules_to_save`` names it or a module holding it); returns whether it did.

    The trainer then trains exactly the module peft adapts (the input side), with the head frozen
    at the base's matrix, as before; the config says ``tie_word_embeddings: false``, so a merged
    export, ``eval.py`` and a vLLM engine build the same untied model (module docstring)."""
    if not tied_embeddings(model):
        return False
    emb_names = _names_of(model, model.get_input_embeddings())
    entries = [e for e in list(lora.target_modules) + list(lora.modules_to_save) if e != ALL_LINEAR_NAME]
    if not any(_covers(n, e) for n in emb_names for e in entries):
        return False
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):  # transformers 5: the tying map save/load consult
        model.all_tied_weights_keys = {}
    log.info("model.lora adapts the embedding, which %s ties to its LM head: the head keeps its own frozen copy "
             "of the base matrix (tie_word_embeddings=false), so merges and engines hold the trained policy",
             type(model).__name__)
    return True


def check_rank(model: nn.Module, lora: LoraConfig, targets: list[str]) -> str | None:
    """A warning (logged and returned) when ``model.lora.r`` gives some adapted layer an adapter no
    smaller than the layer: ``r (in + out) >= in · out``. ``B A`` cannot exceed rank ``min(in, out)``,
    so such an adapter trains more parameters than the layer itself, for no more expressiveness."""
    r, worst = int(lora.r), None
    for name, m in model.named_modules():
        if not any(_matches(name, t) for t in targets):
            continue
        dims = (m.in_features, m.out_features) if isinstance(m, nn.Linear) else \
            (m.num_embeddings, m.embedding_dim) if isinstance(m, nn.Embedding) else None
        if dims and r * sum(dims) >= dims[0] * dims[1] and (worst is None or min(dims) < min(worst[1])):
            worst = (name, dims)
    if worst is None:
        return None
    (name, (n_in, n_out)) = worst
    msg = (f"model.lora.r={r} is not low-rank for {name} ({n_out} x {n_in}): its adapter holds r x (in + out) = "
           f"{r * (n_in + n_out)} parameters, no fewer than the layer's {n_in * n_out}, and B A cannot exceed rank "
           f"{min(n_in, n_out)}. Use model.lora.r <= {(n_in * n_out - 1) // (n_in + n_out)} (or model.lora.r=0 to train "
           "every parameter)")
    log.warning(msg)
    return msg


def apply_lora(model: nn.Module, lora: LoraConfig, gradient_checkpointing: bool = False) -> nn.Module:
    """Wrap ``model`` in a ``PeftModel`` with a fresh adapter; ``model`` unchanged when LoRA is off.

    The adapter's initialisation draws from a forked RNG seeded by the base's identity, so
    building the policy leaves the caller's random stream as it was (a LoRA run samples the
    same rollouts as a full-parameter run of the same seed at step 0).
    """
    if not lora_enabled(lora):
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if lora.r < 0:
        raise ConfigError(f"model.lora.r={lora.r} must be >= 0 (0 or null = full-parameter training)")
    if lora.alpha is not None and lora.alpha <= 0:
        raise ConfigError(f"model.lora.alpha={lora.alpha} must be > 0 (null = 2 x r)")
    targets = resolve_targets(model, list(lora.target_modules))
    check_not_the_head(model, targets, "model.lora.target_modules")
    for name in lora.modules_to_save:
        resolve_targets(model, [name], "model.lora.modules_to_save")
    check_not_the_head(model, list(lora.modules_to_save), "model.lora.modules_to_save")
    check_rank(model, lora, targets)
    saved = saved_module_names(model, list(lora.modules_to_save))
    peft_cfg = PeftLoraConfig(r=int(lora.r), lora_alpha=lora_alpha(lora), lora_dropout=float(lora.dropout),
                              target_modules=targets, modules_to_save=saved or None,
                              bias="none", task_type="CAUSAL_LM")
    identity = base_identity(model)  # the base as loaded (tied or not): what a resume or a worker compares
    model.arlopti_base_identity = identity
    untie_adapted_embedding(model, lora)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(identity["fingerprint"][:8], 16))
        peft_model = get_peft_model(model, peft_cfg)
    if gradient_checkpointing:  # frozen embeddings: checkpointed blocks need an input that requires grad
        peft_model.enable_input_require_grads()
    setup_checkpointing(peft_model, lora.activation_checkpointing, pinned=gradient_checkpointing)
    peft_model.arlopti_base_identity = identity
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    peft_model.register_state_dict_post_hook(_frozen_dropper(trainable))
    n_train = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%g on %s: %d trainable parameters of %d (%.2f%%)", lora.r, lora_alpha(lora),
             peft_cfg.target_modules, n_train, n_all, 100.0 * n_train / max(1, n_all))
    return peft_model


#: ``model.lora.activation_checkpointing=null`` checkpoints a training micro-batch whose freed activations
#: (:func:`freed_activation_bytes`) reach this: below it the recompute costs time for memory no machine
#: that runs the model misses (SmolLM2-135M in fp32: 191 tokens per micro-batch).
AUTO_CHECKPOINT_MIN_BYTES = 256 * 2**20


def decoder_layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's checkpointable decoder layers (transformers' ``GradientCheckpointingLayer``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def freed_activation_bytes(config, tokens: int, element_size: int) -> int:
    """Estimated bytes that checkpointing every decoder layer frees in a forward over ``tokens`` positions.

    Per token and layer autograd keeps about ``10h + 2·kv·d + 4i`` elements (h hidden, kv·d the key/value
    width, i the MLP width: the attention inputs, q, k, v and output, the SwiGLU's four ``i``-wide tensors,
    the two RMSNorms), the count of ``benchmarks/memory_plan.py``'s ``recompute_bytes_per_token`` (Korthikanti
    et al. 2022, with SwiGLU); a checkpointed layer keeps only its input, ``h``. The LoRA adapters' own
    ``r``-wide intermediates are left out (r is far below h). An estimate to decide with, not a measurement:
    benchmarks/bench_lora.py measures the peak."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    return tokens * layers * element_size * (9 * h + 2 * kv * head_dim + 4 * i)


class AutoCheckpointing:
    """``model.lora.activation_checkpointing=null``: before each training forward (grad on, train mode),
    checkpoint every decoder layer when :func:`freed_activation_bytes` of that micro-batch reaches
    :data:`AUTO_CHECKPOINT_MIN_BYTES`, else keep the activations (``PolicyLM.forward`` calls :meth:`prepare`).

    Layers that something else put under checkpointing before the first training forward
    (``model.gradient_checkpointing``, FSDP2's ``activation_checkpointing``) stay as they were: the
    controller then never acts. Non-reentrant ``torch.utils.checkpoint`` (the recompute gives the same
    values, so the gradients are the same bit for bit: tests/models/test_lora_checkpointing.py)."""

    def __init__(self, model: nn.Module, min_bytes: int = AUTO_CHECKPOINT_MIN_BYTES):
        self.config = getattr(model, "config", None)
        self.layers = decoder_layers_of(model)
        self.min_bytes = min_bytes
        self.state: bool | None = None  # what this controller last set; None: not acted yet
        self.pinned = False
        self.on_count = self.off_count = 0

    def decide(self, tokens: int, element_size: int) -> bool:
        return freed_activation_bytes(self.config, tokens, element_size) >= self.min_bytes

    def prepare(self, input_ids: torch.Tensor, element_size: int) -> bool | None:
        """Set the layers for this micro-batch; returns whether they checkpoint (None: pinned, untouched)."""
        if self.pinned or not self.layers:
            return None
        if self.state is None and any(layer.gradient_checkpointing for layer in self.layers):
            self.pinned = True  # someone else turned checkpointing on: leave it
            return None
        on = self.decide(int(input_ids.numel()), element_size)
        if on != self.state:
            import functools

            from torch.utils.checkpoint import checkpoint

            for layer in self.layers:
                layer._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)
                layer.gradient_checkpointing = on
            if on and not self.on_count:
                log.info("model.lora.activation_checkpointing=null: checkpointing the decoder layers for micro-batches "
                         "of %d tokens (estimated %.0f MiB of activations freed)", input_ids.numel(),
                         freed_activation_bytes(self.config, int(input_ids.numel()), element_size) / 2**20)
            self.state = on
        self.on_count += on
        self.off_count += not on
        return on


def setup_checkpointing(peft_model: nn.Module, setting: bool | None, pinned: bool = False) -> None:
    """``model.lora.activation_checkpointing``: true checkpoints every decoder layer now, false leaves them,
    null attaches an :class:`AutoCheckpointing` (``arlopti_auto_checkpointing``) unless ``pinned``
    (``model.gradient_checkpointing=true``: always on already)."""
    if setting is True:
        base = peft_model.get_base_model() if hasattr(peft_model, "get_base_model") else peft_model
        if not getattr(base, "supports_gradient_checkpointing", False):
            raise ConfigError(f"model.lora.activation_checkpointing=true: {type(base).__name__} does not support "
                              "gradient checkpointing; set it to false")
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif setting is None and not pinned:
        peft_model.arlopti_auto_checkpointing = AutoCheckpointing(peft_model)


def is_lora(module: nn.Module) -> bool:
    """Whether ``module`` (a PolicyLM, PeftModel or HF model) carries LoRA adapters."""
    hf = getattr(module, "hf", module)
    return hasattr(hf, "disable_adapter") and hasattr(hf, "peft_config")


def _frozen_dropper(trainable: set[str]):
    """A ``state_dict`` post-hook keeping only the adapter's tensors (names in ``trainable``)."""

    def drop_frozen_weights(module, state_dict, prefix, local_metadata) -> None:
        for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix):] not in trainable]:
            del state_dict[key]

    return drop_frozen_weights


@contextlib.contextmanager
def adapters_disabled(policy: nn.Module) -> Iterator[None]:
    """Run ``policy`` as its base model: the reference log-probs of a LoRA run, with no second copy."""
    hf = getattr(policy, "hf", policy)
    if not is_lora(hf):
        raise TypeError(f"{type(hf).__name__} has no LoRA adapters to disable")
    with hf.disable_adapter():
        yield


def base_model_of(module: nn.Module) -> nn.Module:
    """The HF model under the adapters (the model itself when there are none)."""
    hf = getattr(module, "hf", module)
    return hf.get_base_model() if is_lora(hf) else hf


@torch.no_grad()
def base_identity(model: nn.Module) -> dict:
    """What identifies the frozen base a LoRA checkpoint was trained on: the architecture config
    and a fingerprint of the input embedding's values (float64 sum, sum of squares, first row).

    Computed once, before any sharding; a LoRA checkpoint holds no base weights, so resuming
    or exporting compares this instead (:func:`check_base_identity`). A base untied for LoRA
    (:func:`untie_adapted_embedding`) keeps the identity it had as loaded."""
    if getattr(model, "arlopti_base_identity", None) is not None:
        return model.arlopti_base_identity
    cfg = model.config.to_dict() if hasattr(model, "config") else {}
    arch = {k: cfg.get(k) for k in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "intermediate_size",
                                    "vocab_size", "tie_word_embeddings")}
    emb = model.get_input_embeddings().weight.detach()
    if hasattr(emb, "full_tensor"):
        emb = emb.full_tensor()
    stats = [float(emb.double().sum()), float(emb.double().square().sum())] + emb[0].double().tolist()
    digest = hashlib.sha256(json.dumps([arch, stats], sort_keys=True).encode()).hexdigest()
    return {"arch": arch, "fingerprint": digest}


def check_base_identity(saved: dict | None, current: dict | None, where: str) -> None:
    """Refuse a LoRA checkpoint whose base differs from the model loaded now."""
    if saved is None or current is None:
        return
    if saved.get("fingerprint") != current.get("fingerprint"):
        diff = sorted(k for k in saved.get("arch", {}) if saved["arch"].get(k) != current.get("arch", {}).get(k))
        raise ConfigError(
            f"{where}: this LoRA checkpoint was trained on another base model (base fingerprint "
            f"{saved.get('fingerprint', '?')[:12]} vs {current.get('fingerprint', '?')[:12]} now"
            + (f"; config differs in {diff}" if diff else "; same architecture, different weights")
            + "). It holds only the adapter: resume it with the model.name_or_path it was trained with.")


def note_fidelity(lora: LoraConfig, fidelity: str | None) -> str | None:
    """LoRA under ``fidelity=official`` is allowed, but the official runs train every parameter:
    log (and return) a note saying so."""
    if fidelity != "official" or not lora_enabled(lora):
        return None
    msg = (f"fidelity=official with model.lora.r={lora.r}: the official AR-Lopti runs are full-parameter; "
           "this run trains LoRA adapters, so its updates differ from the official ones (model.lora.r=0 to match)")
    log.warning(msg)
    return msg


def hydra_choice(group: str) -> str | None:
    """The option Hydra chose for ``group`` in this run (None outside a ``@hydra.main`` run)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001  (no Hydra runtime: a compose() in a test or a notebook)
        return None
