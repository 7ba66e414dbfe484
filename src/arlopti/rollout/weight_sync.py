"""Pure helpers for copying a policy's weights into an inference engine (vLLM).

No vLLM import here: everything is plain names and tensors, so it is unit-tested without an
engine. The pieces, in the order a sync uses them:

* :func:`checkpoint_name` strips what wrappers add to a parameter's name (``torch.compile``'s
  ``_orig_mod.``, FSDP1's ``_fsdp_wrapped_module.``, activation checkpointing's
  ``_checkpoint_wrapped_module.``, DDP's leading ``module.`` and :class:`PolicyLM`'s leading
  ``hf.``), giving the name the Hugging Face checkpoint uses.
* :func:`named_sync_params` lists ``(checkpoint name, parameter)`` pairs, dropping a tied
  ``lm_head.weight`` (the engine ties it to the embedding itself).
* :func:`check_names` compares the names about to be sent with the names the engine accepts
  and raises :class:`WeightSyncError` listing both kinds of mismatch. Nothing is skipped quietly.
* :func:`buckets` groups parameters into buckets of at most ``bucket_bytes`` (a parameter
  larger than that is a bucket of its own).
* :func:`stream_tensors` yields ``(name, tensor)`` bucket by bucket: for each bucket it
  gathers every parameter (:func:`full_tensor`: an FSDP2 ``DTensor`` becomes the full tensor
  via its collective ``full_tensor()``), casts, and only then moves on, so at most one
  bucket of gathered copies exists at a time. Under FSDP2 every rank must consume the stream
  in the same order because each ``full_tensor()`` is a collective.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

# Segments inserted anywhere in a name by wrappers; never part of a Hugging Face checkpoint name.
WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
# Segments that wrappers put in front of the model: DDP's ``module`` and PolicyLM's ``hf``.
LEADING_SEGMENTS = ("module", "hf")
TIED_HEAD = "lm_head.weight"


class WeightSyncError(ValueError):
    """The names sent to the engine do not match the names it holds; the message lists them."""


def checkpoint_name(name: str) -> str:
    """The Hugging Face checkpoint name of a (possibly wrapped) parameter name.

    Every ``_orig_mod`` / ``_fsdp_wrapped_module`` / ``_checkpoint_wrapped_module`` segment is
    removed wherever it occurs; then leading ``module`` and ``hf`` segments are removed
    (repeatedly, in any order). ``"hf._orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight"``
    → ``"model.layers.0.mlp.up_proj.weight"``.
    """
    parts = [p for p in name.split(".") if p not in WRAPPER_SEGMENTS]
    while parts and parts[0] in LEADING_SEGMENTS:
        parts.pop(0)
    if not parts:
        raise WeightSyncError(f"parameter name {name!r} is empty once wrapper prefixes are removed")
    return ".".join(parts)


def named_sync_params(named_parameters: Iterable[tuple[str, Any]], tie_word_embeddings: bool) -> list[tuple[str, Any]]:
    """``(checkpoint name, parameter)`` pairs to send, in the module's order.

    ``lm_head.weight`` is dropped when the embeddings are tied: the engine's head *is* its
    embedding, and ``named_parameters`` may list the shared tensor under either name. Two
    parameters mapping to the same checkpoint name are an error (a wrapper we do not know).
    """
    out: list[tuple[str, Any]] = []
    seen: dict[str, str] = {}
    for raw, param in named_parameters:
        name = checkpoint_name(raw)
        if tie_word_embeddings and name == TIED_HEAD:
            continue
        if name in seen:
            raise WeightSyncError(f"parameters {seen[name]!r} and {raw!r} both map to checkpoint name {name!r}")
        seen[name] = raw
        out.append((name, param))
    return out


def _listing(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def check_names(sent: Iterable[str], expected: Iterable[str], where: str = "the engine") -> None:
    """Raise :class:`WeightSyncError` unless ``sent`` and ``expected`` are the same set.

    The message lists the sent names the engine does not know and the engine's names that
    would not be updated (each sorted, first 20 shown with a count of the rest).
    """
    sent_set, exp_set = set(sent), set(expected)
    unknown = sorted(sent_set - exp_set)
    missing = sorted(exp_set - sent_set)
    if not unknown and not missing:
        return
    lines = [f"weight sync name mismatch with {where}:"]
    if unknown:
        lines.append(f"  {len(unknown)} name(s) sent that {where} does not hold: {_listing(unknown)}")
    if missing:
        lines.append(f"  {len(missing)} name(s) {where} holds that were not sent (would stay stale): "
                     f"{_listing(missing)}")
    lines.append("  A wrapper may have renamed the parameters (see arlopti.rollout.weight_sync.checkpoint_name), "
                 "or the policy is not the model the engine was built from.")
    raise WeightSyncError("\n".join(lines))


def nbytes(tensor: Any) -> int:
    """Bytes of the *full* tensor (a DTensor reports its global shape)."""
    return int(tensor.numel()) * int(tensor.element_size())


def buckets(items: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Consecutive groups whose total :func:`nbytes` is at most ``bucket_bytes``.

    Greedy and order-preserving; a single item larger than ``bucket_bytes`` forms its own
    bucket. ``bucket_bytes <= 0`` puts every item in its own bucket.
    """
    cur: list[tuple[str, Any]] = []
    size = 0
    for name, t in items:
        n = nbytes(t)
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur


def full_tensor(t: Any) -> torch.Tensor:
    """The whole, detached tensor: ``t.full_tensor()`` for an FSDP2 DTensor (a collective), else ``t``."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach()


def stream_tensors(items: Sequence[tuple[str, Any]], bucket_bytes: int, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every item, gathering one bucket at a time.

    Within a bucket every parameter is gathered (:func:`full_tensor`) and cast to ``dtype`` /
    moved to ``device`` (when given) before the first of them is yielded; the bucket's copies
    are released before the next bucket is gathered.
    """
    for bucket in buckets(items, bucket_bytes):
        ready = []
        for name, t in bucket:
            full = full_tensor(t)
            if (dtype is not None and full.dtype != dtype) or (device is not None and full.device != torch.device(device)):
                full = full.to(device=device, dtype=dtype)
            ready.append((name, full))
        for pair in ready:
            yield pair
        del ready
