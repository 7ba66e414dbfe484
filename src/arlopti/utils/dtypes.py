"""The floating-point dtypes a config may name, once: names to torch dtypes and back.

``model.dtype``, ``model.reference_dtype``, ``rollout.dtype``, FSDP2's ``param_dtype`` /
``reduce_dtype`` and ``python -m arlopti.checkpoints.export --dtype`` all take these names
(:data:`DTYPES`); FSDP2 also takes Lightning's short forms (:data:`ALIASES`).
"""

from __future__ import annotations

import torch

#: name -> dtype, in the order the docs list them
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Lightning's short names
ALIASES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: the config's ``choices`` table (name -> note)
DTYPE_CHOICES: dict[str, str] = {"float32": "32-bit", "bfloat16": "bf16 (8-bit exponent)", "float16": "fp16"}


def torch_dtype(name: str, key: str, aliases: bool = False) -> torch.dtype:
    """The torch dtype ``name`` means; a ``ValueError`` naming ``key`` and the choices otherwise."""
    if aliases:
        name = ALIASES.get(name, name)
    if name not in DTYPES:
        extra = f" (or {', '.join(ALIASES)})" if aliases else ""
        raise ValueError(f"{key}={name!r}: use one of {', '.join(DTYPES)}{extra}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The config name of ``dtype`` (``torch.bfloat16`` -> ``"bfloat16"``)."""
    for k, v in DTYPES.items():
        if v == dtype:
            return k
    raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")


__all__ = ["ALIASES", "DTYPES", "DTYPE_CHOICES", "dtype_name", "torch_dtype"]
