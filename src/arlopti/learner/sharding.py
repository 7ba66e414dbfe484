"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the policy and the reference model.

``trainer=fsdp`` selects :class:`FSDP2Strategy`, Lightning's ``ModelParallelStrategy`` with
``tensor_parallel_size=1`` and ``data_parallel_size`` following devices x nodes. The strategy
carries the sharding options (:class:`FSDPOptions`); ``GRPOModule.configure_model`` then calls
:func:`apply_fsdp2` on the policy (and the reference model): ``fully_shard`` on every decoder
layer, then on the root :class:`~arlopti.learner.policy.PolicyLM`, over the mesh's
``data_parallel`` dimension. The same code runs on CPU (gloo) and on GPUs (NCCL).

Options:

* ``mixed_precision="bf16"``: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``;
  master weights and optimizer state stay in the model's dtype (fp32 by default).
* ``activation_checkpointing``: non-reentrant checkpointing of each decoder layer (through the
  Hugging Face model's own ``gradient_checkpointing_enable``, which wraps exactly the layers).
* ``cpu_offload``: ``CPUOffloadPolicy`` (sharded parameters, gradients and optimizer state
  live in CPU memory; needs a GPU accelerator).

The decoder-layer class comes from ``model.decoder_layer_class`` when set, else from the
model's ``_no_split_modules`` (every Hugging Face decoder declares it), else from
:data:`KNOWN_DECODER_LAYERS`; a model with none of these gets an error naming the config key.

Generation with a sharded policy holds it unsharded through
:func:`arlopti.utils.fsdp_unshard.unsharded_for_generate` (a layer below both learner and rollout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arlopti.utils.dtypes import ALIASES, DTYPES, torch_dtype
from torch import nn

from lightning.pytorch.strategies import ModelParallelStrategy

# Class names of decoder layers known to work, for models that do not declare _no_split_modules.
KNOWN_DECODER_LAYERS = ("Qwen2DecoderLayer", "Qwen3DecoderLayer", "LlamaDecoderLayer", "MistralDecoderLayer",
                        "Gemma2DecoderLayer", "Phi3DecoderLayer")

class ShardingError(ValueError):
    """FSDP2 cannot be applied as configured; the message names the key to change."""


@dataclass
class FSDPOptions:
    """How :func:`apply_fsdp2` shards a model (see the module docstring)."""

    mixed_precision: str | None = None  # null | bf16 | fp16: the param dtype of forward/backward
    reduce_dtype: str = "float32"  # gradient reduce-scatter dtype under mixed precision
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool | None = None  # null: FSDP2's default (layers yes, root no)

    def __post_init__(self) -> None:
        if self.mixed_precision is not None and ALIASES.get(self.mixed_precision, self.mixed_precision) not in DTYPES:
            raise ShardingError(f"trainer.strategy.mixed_precision={self.mixed_precision!r}: "
                                "use null, 'bf16' or 'fp16'")
        if ALIASES.get(self.reduce_dtype, self.reduce_dtype) not in DTYPES:
            raise ShardingError(f"trainer.strategy.reduce_dtype={self.reduce_dtype!r}: use 'float32' or 'bf16'")


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` for pure data-parallel FSDP2, with the sharding options attached.

    ``data_parallel_size="auto"`` means every process (devices x nodes); tensor parallelism is
    fixed at 1. The options are read by ``GRPOModule.configure_model``.
    """

    def __init__(self, data_parallel_size: int | str = "auto", mixed_precision: str | None = None,
                 reduce_dtype: str = "float32", activation_checkpointing: bool = False, cpu_offload: bool = False,
                 reshard_after_forward: bool | None = None, save_distributed_checkpoint: bool = True,
                 process_group_backend: str | None = None, **kwargs):
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, **kwargs)
        self.fsdp_options = FSDPOptions(mixed_precision=mixed_precision, reduce_dtype=reduce_dtype,
                                        activation_checkpointing=activation_checkpointing, cpu_offload=cpu_offload,
                                        reshard_after_forward=reshard_after_forward)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        if self.fsdp_options.cpu_offload and self.root_device.type == "cpu":
            raise ShardingError("trainer.strategy.cpu_offload=true needs a GPU accelerator (trainer.accelerator=gpu); "
                                "on CPU the parameters are already in CPU memory")
        super().setup_environment()


def module_class_names(model: nn.Module) -> list[str]:
    """Sorted distinct class names of ``model``'s submodules (for error messages)."""
    return sorted({type(m).__name__ for m in model.modules()})


def decoder_layer_class(model: nn.Module, name: str | None = None) -> type[nn.Module]:
    """The class of ``model``'s decoder layers, to shard (and checkpoint) one by one.

    ``name``: a class name (``Qwen2DecoderLayer``) or dotted path; else inferred from
    ``model._no_split_modules``, then :data:`KNOWN_DECODER_LAYERS`. FSDP wrappers are looked
    through (an already sharded layer's class is ``FSDP<Name>``, a subclass of ``<Name>``).
    """
    def find(cls_name: str) -> type[nn.Module] | None:
        short = cls_name.rsplit(".", 1)[-1]
        for m in model.modules():
            for cls in type(m).__mro__:
                if cls.__name__ == short and (cls_name == short or f"{cls.__module__}.{cls.__name__}" == cls_name):
                    return cls
        return None

    if name:
        cls = find(name)
        if cls is None:
            raise ShardingError(f"model.decoder_layer_class={name!r}: no submodule of {type(model).__name__} has that "
                                f"class; its module classes are {module_class_names(model)}")
        return cls
    declared = list(getattr(model, "_no_split_modules", None) or [])
    for cls_name in declared + list(KNOWN_DECODER_LAYERS):
        cls = find(cls_name)
        if cls is not None:
            return cls
    raise ShardingError(
        f"FSDP2: cannot tell the decoder-layer class of {type(model).__name__} (it declares no _no_split_modules and "
        f"has none of {list(KNOWN_DECODER_LAYERS)}). Name it with model.decoder_layer_class=<ClassName>, one of its "
        f"module classes: {module_class_names(model)}")


def decoder_layers(model: nn.Module, cls: type[nn.Module]) -> list[nn.Module]:
    """Every submodule of class ``cls``, outermost first (matches nested in a match are skipped)."""
    out: list[nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():  # pre-order: a layer comes before its children
        if isinstance(m, cls) and id(m) not in inside:
            out.append(m)
            inside.update(id(c) for c in m.modules())
    return out


def is_fsdp2(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def enable_activation_checkpointing(hf_model: nn.Module) -> None:
    """Non-reentrant activation checkpointing of each decoder layer of a Hugging Face model."""
    if not getattr(hf_model, "supports_gradient_checkpointing", False):
        raise ShardingError(f"trainer.strategy.activation_checkpointing=true: {type(hf_model).__name__} does not "
                            "support gradient checkpointing; set it to false")
    hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp2(policy: nn.Module, mesh, options: FSDPOptions | None = None,
                layer_class_name: str | None = None) -> int:
    """Shard ``policy`` (a ``PolicyLM``, or any module with ``.hf``) in place; returns the layer count.

    ``fully_shard`` each decoder layer, then the root, over the 1-D ``mesh``. Idempotent: an
    already sharded root is left alone.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if is_fsdp2(policy):
        return 0
    options = options or FSDPOptions()
    hf = getattr(policy, "hf", policy)
    cls = decoder_layer_class(hf, layer_class_name)
    layers = decoder_layers(hf, cls)
    if options.activation_checkpointing and any(p.requires_grad for p in policy.parameters()):
        enable_activation_checkpointing(hf)
    kwargs: dict = {"mesh": mesh}
    if options.mixed_precision is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch_dtype(options.mixed_precision, "trainer.strategy.mixed_precision", aliases=True),
            reduce_dtype=torch_dtype(options.reduce_dtype, "trainer.strategy.reduce_dtype", aliases=True))
    kwargs["offload_policy"] = CPUOffloadPolicy() if options.cpu_offload else OffloadPolicy()
    layer_kwargs = dict(kwargs)
    if options.reshard_after_forward is not None:
        layer_kwargs["reshard_after_forward"] = options.reshard_after_forward
    for layer in layers:
        fully_shard(layer, **layer_kwargs)
    fully_shard(policy, **kwargs)
    return len(layers)


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``module`` as a full CPU tensor, on every rank (collective).

    DTensors are gathered with ``full_tensor()``; plain tensors are copied. For tests and
    small exports; large models should use ``torch.distributed.checkpoint``.
    """
    out = {}
    for k, v in module.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().cpu().clone()
    return out


__all__ = ["FSDP2Strategy", "FSDPOptions", "KNOWN_DECODER_LAYERS", "ShardingError", "apply_fsdp2",
           "decoder_layer_class", "decoder_layers", "enable_activation_checkpointing", "full_state_dict", "is_fsdp2"]


def shard_learner(policy: nn.Module, ref: nn.Module | None, strategy, mesh, decoder_layer_class_name: str | None) -> None:
    """FSDP2 over the data-parallel mesh for the policy and (with the same precision and offload,
    no activation checkpointing: it never runs backward) the frozen reference model."""
    if mesh["tensor_parallel"].size() != 1:
        raise ShardingError(f"tensor_parallel_size={mesh['tensor_parallel'].size()}: arlopti shards data-parallel "
                            "only; use trainer=fsdp (tensor_parallel_size=1)")
    options = getattr(strategy, "fsdp_options", None) or FSDPOptions()
    dp = mesh["data_parallel"]
    apply_fsdp2(policy, dp, options, decoder_layer_class_name)
    if ref is not None:
        ref_options = FSDPOptions(mixed_precision=options.mixed_precision, reduce_dtype=options.reduce_dtype,
                                  cpu_offload=options.cpu_offload)
        apply_fsdp2(ref, dp, ref_options, decoder_layer_class_name)


def shard_under_model_parallel(module, strategy, decoder_layer_class_name: str | None) -> None:
    """:func:`shard_learner` on ``module.policy`` and ``module.ref`` when ``strategy`` is a
    ``ModelParallelStrategy`` (``trainer=fsdp``); nothing otherwise."""
    if isinstance(strategy, ModelParallelStrategy):
        shard_learner(module.policy, module.ref, strategy, module.device_mesh, decoder_layer_class_name)
