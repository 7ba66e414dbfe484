"""Rollout dumps: JSONL of what the learner saw at one step, for offline analysis.

A dump file holds one JSON object per response (:func:`step_records` builds them from a step's
:class:`~arlopti.learner.step_context.StepContext`, :func:`write_records` writes them, :func:`read_dump`
reads them back). :class:`arlopti.callbacks.rollout_dump.RolloutDumpCallback` writes them during
training, ``python -m arlopti.analysis dump`` from a sampled batch.

Record fields (schema ``arlopti.rollout_dump/1``):

* ``step``, ``rank``, ``world_size``, ``row`` (index in rank 0's batch), ``group_id``;
* ``prompt`` and ``completion`` (text), ``reward``, ``correct``, ``truncated``, ``components``
  (the task's reward components, e.g. ``format_ok``), ``response_len`` (tokens), ``meta``;
* with ``token_arrays: true`` (default), base64 of little-endian arrays, one entry per response
  token: ``prompt_ids`` and ``response_ids`` (int32; the prompt without its left padding),
  ``token_probs`` (float16, p_old = exp(old_log_probs) at the rollout temperature),
  ``advantages_raw`` and ``advantages`` (float16, before and after AR). :func:`read_dump`
  decodes them back to numpy arrays. float16 keeps ~3 significant digits: enough for bucketing
  and plots, not for bit-exact replays (recompute log-probs from the ids for those).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

SCHEMA = "arlopti.rollout_dump/1"
_ARRAYS = {"prompt_ids": "<i4", "response_ids": "<i4", "token_probs": "<f2", "advantages_raw": "<f2",
           "advantages": "<f2"}


def encode_array(values: Any, dtype: str) -> str:
    """base64 of ``values`` as a little-endian numpy array of ``dtype`` (e.g. ``"<f2"``)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().float().numpy() if values.is_floating_point() else values.cpu().numpy()
    return base64.b64encode(np.ascontiguousarray(np.asarray(values).astype(dtype)).tobytes()).decode("ascii")


def decode_array(text: str, dtype: str) -> np.ndarray:
    """Inverse of :func:`encode_array` (returns a numpy array of ``dtype``)."""
    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return json.loads(json.dumps(value, default=str))


def step_records(ctx, step: int, rank: int = 0, world_size: int = 1, token_arrays: bool = True,
                 max_rows: int | None = None) -> list[dict]:
    """The dump records of one :class:`~arlopti.learner.step_context.StepContext` (module docstring)."""
    experience = ctx.experience
    mask = experience.response_mask.bool().cpu()
    n = len(experience) if max_rows is None else min(len(experience), max_rows)
    probs = torch.exp(ctx.old_log_probs.detach().float()).cpu()
    adv_raw, adv = ctx.advantages_raw.detach().cpu(), ctx.advantages.detach().cpu()
    attn = experience.attention_mask.cpu()
    ids = experience.input_ids.cpu()
    records = []
    for i in range(n):
        m = mask[i]
        rec = {
            "schema": SCHEMA, "step": int(step), "rank": rank, "world_size": world_size, "row": i,
            "group_id": int(experience.group_ids[i]),
            "prompt": experience.prompt_texts[i] if experience.prompt_texts else "",
            "completion": experience.response_texts[i] if experience.response_texts else "",
            "reward": float(experience.rewards[i]), "correct": bool(experience.correct[i]),
            "truncated": bool(experience.truncated[i]),
            "components": {k: float(v[i]) for k, v in experience.components.items()},
            "response_len": int(m.sum()),
            "meta": _jsonable(experience.metas[i]) if experience.metas else {},
        }
        if token_arrays:
            prompt = ids[i, :experience.prompt_len][attn[i, :experience.prompt_len].bool()]
            rec.update(
                prompt_ids=encode_array(prompt, "<i4"),
                response_ids=encode_array(ids[i, experience.prompt_len:][m], "<i4"),
                token_probs=encode_array(probs[i][m], "<f2"),
                advantages_raw=encode_array(adv_raw[i][m], "<f2"),
                advantages=encode_array(adv[i][m], "<f2"))
        records.append(rec)
    return records


def write_records(path: str | Path, records: list[dict]) -> Path:
    """Write JSONL (gzip-compressed when ``path`` ends in ``.gz``); atomic via a temp file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    tmp.write_bytes(gzip.compress(body) if path.suffix == ".gz" else body)
    tmp.replace(path)
    return path


def read_dump(path: str | Path) -> list[dict]:
    """All records of a dump file, or of every ``rollouts_step*.jsonl[.gz]`` in a folder, step order.

    Token arrays are decoded to numpy arrays. A line that is not JSON, or a record without the
    schema tag, raises ``ValueError`` naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("rollouts_step*.jsonl")) + sorted(path.glob("rollouts_step*.jsonl.gz"))
        if not files:
            raise FileNotFoundError(f"{path}: no rollouts_step*.jsonl[.gz] files in this folder")
        out = [r for f in files for r in read_dump(f)]
        return sorted(out, key=lambda r: (r["step"], r.get("rank", 0), r.get("row", 0)))
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such rollout dump")
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    out = []
    for lineno, line in enumerate(io.StringIO(text), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not a JSON line ({err})") from err
        if rec.get("schema") != SCHEMA:
            raise ValueError(f"{path}:{lineno}: schema {rec.get('schema')!r}, expected {SCHEMA!r}")
        for key, dtype in _ARRAYS.items():
            if key in rec:
                rec[key] = decode_array(rec[key], dtype)
        out.append(rec)
    return out
