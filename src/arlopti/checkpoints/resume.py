"""Where a run resumes from: ``ckpt_path`` resolved to a complete checkpoint, on plain paths.

A run writes under ``<log_dir>/<task_name>/<run_name>/<time>/`` (Hydra's run directory, its
``output_dir``; ``run_name`` says α, η and the seed, see :mod:`arlopti.config.run_name`), and its
checkpoint callback (:mod:`arlopti.callbacks.checkpointing`) keeps ``checkpoints/last.ckpt``
there, a file or, under FSDP2, a distributed-checkpoint folder with a ``meta.pt``.
:func:`resolve_ckpt_path` turns the ``ckpt_path`` setting into the checkpoint to load:

* ``last``: this run's ``checkpoints/last.ckpt``, else the most recently written ``last.ckpt``
  of any earlier run of the same ``task_name`` and ``run_name`` (:func:`find_last_checkpoint`);
  an error if there is none;
* ``auto``: this run's ``checkpoints/last.ckpt`` if there is one, else ``None`` (a fresh start:
  job scripts that pass a fixed ``hydra.run.dir`` and are requeued);
* a run directory: its ``checkpoints/last.ckpt``;
* a checkpoint file or FSDP2 checkpoint folder: itself.

Wherever ``last.ckpt`` is looked for, ``last.ckpt.old`` (the previous verified save, kept beside
it) counts too (:func:`last_in`). The result is checked to be complete and intact
(:func:`validate_checkpoint`, without loading any weight): a truncated file or shard is named, and
so is a damaged one - a single file's zip entries are checked against their CRC-32 (torch writes
one per tensor blob), a distributed folder's files against the sha256 manifest
(``arlopti-manifest.json``) written when it was saved. With ``last`` and ``auto`` a damaged
checkpoint is skipped, with a warning, for the newest intact one (``last.ckpt.old``, or an
earlier run's); an explicit path that is damaged is an error. Rank 0's answer for ``last`` is
exported (by ``arlopti.entry.train``, which owns the process environment) as ``ARLOPTI_RESOLVED_CKPT``,
so that the ranks Lightning launches from it resume from the same checkpoint rather than search
again (a rank could otherwise find a checkpoint written since): :func:`inherited_answer` reads it
back, and :func:`resolve_ckpt_path` takes it as a value. Nothing here needs Hydra or writes the
environment: the caller passes the directories as values (``arlopti.entry.train.run_dirs`` reads them
from the composed config).

A checkpoint's run state is read here too: :func:`load_checkpoint_metadata` (its non-tensor part),
:func:`config_mismatches` and :func:`check_resume_compatible` (its run config against this run's),
:func:`finished_reason` (whether it already reached the end of training). ``train.py``,
``evaluate.py``, ``export.py`` and the checkpoint callback all call this module; its two error
types are :class:`CheckpointError` (a checkpoint that cannot be used) and
:class:`CheckpointNotFoundError` (``ckpt_path`` names none).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import zipfile
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

LAST = "last.ckpt"
META = "meta.pt"  # Lightning's metadata file inside a distributed-checkpoint folder
MANIFEST = "arlopti-manifest.json"  # sha256 of every file of a distributed-checkpoint folder
# rank 0's answer for ckpt_path=last, inherited by the ranks it launches
RESOLVED_ENV = "ARLOPTI_RESOLVED_CKPT"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the file and what to do."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """``ckpt_path`` names no checkpoint (a missing path, a run directory or folder without one, no
    ``last.ckpt`` for ``last``); a :class:`CheckpointError` and a ``FileNotFoundError`` both."""


def last_in(checkpoints: Path) -> Path | None:
    """``checkpoints/last.ckpt``, else ``last.ckpt.old`` (the previous save, which every save keeps;
    alone when a save was interrupted mid-rename). Does not check either: see :func:`last_candidates`."""
    for name in (LAST, LAST + ".old"):
        p = Path(checkpoints) / name
        if p.is_file() or (p.is_dir() and (p / META).is_file()):
            return p
    return None


def last_candidates(checkpoints: Path) -> list[Path]:
    """``checkpoints/last.ckpt`` and ``last.ckpt.old``, those that exist, newest save first."""
    out = []
    for name in (LAST, LAST + ".old"):
        p = Path(checkpoints) / name
        if p.is_file() or (p.is_dir() and (p / META).is_file()):
            out.append(p)
    return out


def last_checkpoint_candidates(output_dir: str | Path | None, log_dir: str | Path, task_name: str,
                               run_name: str) -> list[Path]:
    """Every checkpoint ``ckpt_path=last`` may use, in order of preference: this run's
    ``last.ckpt`` and ``last.ckpt.old``, then those of the earlier runs of the same ``task_name``
    and ``run_name``, most recently written first (:func:`find_last_checkpoint` is the first)."""
    own_dir = Path(output_dir) / "checkpoints" if output_dir is not None else None
    own = last_candidates(own_dir) if own_dir is not None else []
    runs = Path(log_dir) / str(task_name) / str(run_name)
    others = [p for d in runs.glob("*/checkpoints") if own_dir is None or d.resolve() != own_dir.resolve()
              for p in last_candidates(d)]
    # each run's last.ckpt before its .old, then the runs newest first
    others.sort(key=lambda p: (_written_at(p.parent / LAST) if (p.parent / LAST).exists() else _written_at(p),
                               p.name == LAST), reverse=True)
    return own + others


def find_last_checkpoint(output_dir: str | Path | None, log_dir: str | Path, task_name: str,
                         run_name: str) -> Path | None:
    """``ckpt_path=last``: this run's ``checkpoints/last.ckpt``, else the most recently written
    ``last.ckpt`` of any run of the same ``task_name`` and ``run_name`` (α, η, seed) under
    ``log_dir`` (``<log_dir>/<task_name>/<run_name>/<time>/checkpoints``).

    "This run" is ``output_dir`` (Hydra's run dir; None when unknown): pass
    ``hydra.run.dir=...`` to resume a fixed directory (SLURM requeue), otherwise each launch gets
    a new timestamped directory and the newest earlier run of the task is used.
    """
    own = last_in(Path(output_dir) / "checkpoints") if output_dir is not None else None
    if own is not None:
        return own
    runs = Path(log_dir) / str(task_name) / str(run_name)
    found = [p for d in runs.glob("*/checkpoints") if (p := last_in(d)) is not None]
    return max(found, key=_written_at) if found else None


def _written_at(p: Path) -> float:
    return (p / META).stat().st_mtime if p.is_dir() else p.stat().st_mtime


def inherited_answer(environ: Mapping[str, str]) -> str | None:
    """Rank 0's answer for ``ckpt_path=last`` (:data:`RESOLVED_ENV`) when ``environ`` is that of a
    rank Lightning launched (``LOCAL_RANK`` > 0), else None (rank 0 searches itself)."""
    inherited = environ.get(RESOLVED_ENV)
    return inherited if inherited and int(environ.get("LOCAL_RANK", "0")) > 0 else None


def resolve_ckpt_path(ckpt_path: str | Path | None, *, output_dir: str | Path | None = None,
                      log_dir: str | Path | None = None, task_name: str | None = None,
                      run_name: str | None = None, inherited: str | None = None) -> str | None:
    """The checkpoint ``ckpt_path`` names (see the module docstring), checked to be complete.

    ``output_dir`` is this run's directory (None when unknown); ``log_dir``, ``task_name`` and
    ``run_name`` locate the earlier runs that ``last`` searches. An explicit path needs none of them.
    ``inherited`` (:func:`inherited_answer`): rank 0's answer for ``last``, used without a search.
    """
    if ckpt_path in (None, ""):
        return None
    ckpt_path = str(ckpt_path)
    if ckpt_path == "auto":
        found = last_candidates(Path(output_dir) / "checkpoints") if output_dir is not None else []
        if not found:
            log.info("ckpt_path=auto: no checkpoint in this run directory; starting from scratch")
            return None
        path = _first_intact(found, "auto")
    elif ckpt_path == "last":
        if inherited:
            return inherited  # a rank Lightning started: use what rank 0 found, not a fresh search
        found = last_checkpoint_candidates(output_dir, log_dir, task_name, run_name)
        if not found:
            own = f"{output_dir}/checkpoints" if output_dir is not None else "<this run>/checkpoints"
            raise CheckpointNotFoundError(
                f"ckpt_path=last: no last.ckpt under {own} nor under any earlier run of "
                f"task_name={task_name}, run_name={run_name} in {log_dir}/{task_name}/{run_name}; "
                "pass an explicit ckpt_path")
        path = _first_intact(found, "last")
    else:
        path = named_checkpoint(ckpt_path)
    return str(path)


def _first_intact(candidates: list[Path], setting: str) -> Path:
    """The first of ``candidates`` that :func:`validate_checkpoint` accepts; each damaged one is
    logged as skipped. All damaged: a :class:`CheckpointError` listing them."""
    errors = []
    for i, p in enumerate(candidates):
        try:
            validate_checkpoint(p)
        except CheckpointError as err:
            errors.append(str(err))
            nxt = candidates[i + 1] if i + 1 < len(candidates) else None
            log.warning("ckpt_path=%s: skipping damaged checkpoint %s (%s); %s", setting, p, err,
                        f"falling back to {nxt}" if nxt is not None else "no other checkpoint to fall back to")
            continue
        if errors:
            log.warning("ckpt_path=%s: falling back to the newest intact checkpoint %s", setting, p)
        return p
    raise CheckpointError(f"ckpt_path={setting}: every candidate checkpoint is damaged:\n  " + "\n  ".join(errors))


def named_checkpoint(ckpt_path: str | Path) -> Path:
    """An explicit ``ckpt_path``: a checkpoint file or folder, or a run directory (its last.ckpt);
    checked to be complete and intact (:func:`validate_checkpoint`)."""
    return validate_checkpoint(_named_path(ckpt_path))


def _named_path(ckpt_path: str | Path) -> Path:
    path = Path(ckpt_path)
    if not path.exists():
        raise CheckpointNotFoundError(f"ckpt_path={ckpt_path!r} does not exist")
    if path.is_dir() and (path / "checkpoints").is_dir():  # a run directory
        found = last_in(path / "checkpoints")
        if found is None:
            raise CheckpointNotFoundError(
                f"ckpt_path={ckpt_path!r} is a run directory without checkpoints/last.ckpt (looked for "
                f"{path / 'checkpoints' / LAST} and {path / 'checkpoints' / (LAST + '.old')})")
        return found
    if path.is_dir() and not _looks_like_distributed_checkpoint(path):
        raise CheckpointNotFoundError(
            f"ckpt_path={ckpt_path!r} is a folder that holds no checkpoint. Looked for: a run directory's "
            f"{path / 'checkpoints' / LAST} (or {LAST}.old), and a distributed-checkpoint folder's {path / META} "
            "or *.distcp shards. Pass a run directory, a .ckpt file, or ckpt_path=last")
    return path


def _looks_like_distributed_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds any part of a distributed checkpoint (its metadata, a shard, the manifest)."""
    return (folder / META).exists() or (folder / MANIFEST).exists() or any(folder.glob("*.distcp"))


def first_nonfinite(named_tensors) -> tuple[str, int, int] | None:
    """``(name, bad count, numel)`` of the first floating-point tensor of ``named_tensors`` (an
    iterable of ``(name, tensor)``) holding NaN or inf, else None. DTensor shards are read locally."""
    import torch

    for name, t in named_tensors:
        if not isinstance(t, torch.Tensor) or not torch.is_floating_point(t):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        finite = torch.isfinite(local)
        if not bool(finite.all()):
            return name, int((~finite).sum()), local.numel()
    return None


# (path, size, mtime_ns) of checkpoints verified in this process: each is read in full only once
_VERIFIED: set[tuple] = set()


def validate_checkpoint(path: str | Path) -> Path:
    """Check that ``path`` is a complete, intact checkpoint (file or distributed folder) without
    loading weights (it reads every byte once per process: a few seconds per GB).

    Raises :class:`CheckpointError` naming the offending file: a truncated or non-zip file, a zip
    entry (a tensor blob) whose bytes fail its CRC-32, a folder without its metadata, a shard
    shorter than its metadata says, or a file of a folder whose sha256 differs from its manifest.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    key = _identity(path)
    if key in _VERIFIED:
        return path
    if path.is_file():
        _check_file(path)
    else:
        _check_folder(path)
    if time.time() - max(t for *_, t in key[1:]) / 1e9 > 2:  # not written just now (mtime granularity)
        _VERIFIED.add(key)
    return path


def _identity(path: Path) -> tuple:
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file())
    return (str(path.resolve()),) + tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def _check_file(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({err}); it was probably cut off "
                              f"by a crash during a save: use an earlier checkpoint (e.g. {LAST}.old)") from err
    if not any(n.endswith("data.pkl") for n in names):
        raise CheckpointError(f"checkpoint file {path} is a zip archive but not a torch checkpoint")
    _check_crcs(path)


def _check_crcs(path: Path) -> None:
    """Read every zip entry against the CRC-32 torch wrote for it (``torch.load`` does not check)."""
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            try:
                with z.open(info) as f:
                    while f.read(1 << 24):
                        pass
            except (zipfile.BadZipFile, OSError, EOFError) as err:
                raise CheckpointError(
                    f"checkpoint file {path} is corrupt: entry {info.filename!r}{_entry_key(path, info.filename)} "
                    f"fails its integrity check ({err}); its bytes changed after the save. Use an earlier "
                    f"checkpoint (e.g. {LAST}.old)") from err


def _entry_key(path: Path, entry: str) -> str:
    """`` (tensor <key>)``: which tensor of the checkpoint a damaged ``.../data/<n>`` entry holds,
    from the pickle (never loads a tensor); empty when it cannot tell."""
    import io
    import pickle

    storage = entry.rsplit("/", 1)[-1]
    if "/data/" not in entry:
        return ""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
            raw = z.read(pkl)
    except Exception:
        return ""
    found: list[str] = []

    class _Key:  # stands for a storage: remembers its key
        def __init__(self, key):
            self.key = key

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if name.startswith("_rebuild_"):
                return lambda storage, *a, **k: storage
            try:
                return super().find_class(module, name)
            except Exception:
                return lambda *a, **k: None

        def persistent_load(self, pid):
            return _Key(str(pid[2]))

    try:
        obj = _Unpickler(io.BytesIO(raw)).load()
    except Exception:
        return ""

    def walk(o, prefix):
        if isinstance(o, _Key):
            if o.key == storage:
                found.append(prefix)
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{prefix}[{i}]")

    walk(obj, "")
    return f" (tensor {', '.join(found[:3])})" if found else ""


def _check_folder(path: Path) -> None:
    meta = path / META
    if not meta.is_file():
        raise CheckpointError(f"checkpoint folder {path} has no {META}: not a complete distributed checkpoint "
                              "(a save interrupted before it finished?)")
    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as err:
        raise CheckpointError(f"checkpoint folder {path}: cannot read {path / '.metadata'} ({err})") from err
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(needed.items()):
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint folder {path}: shard {f} is missing")
        if f.stat().st_size < size:
            raise CheckpointError(f"checkpoint shard {f} is truncated ({f.stat().st_size} bytes, its metadata "
                                  f"needs {size}); use an earlier checkpoint")
    manifest = path / MANIFEST
    if not manifest.is_file():
        log.warning("checkpoint folder %s has no %s (saved before integrity manifests): its shards' contents "
                    "are not verified", path, MANIFEST)
        return
    try:
        expected = json.loads(manifest.read_text())["sha256"]
    except Exception as err:
        raise CheckpointError(f"checkpoint folder {path}: {manifest} is unreadable ({err})") from err
    for rel, digest in sorted(expected.items()):
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint folder {path}: {f} (listed in {MANIFEST}) is missing")
        if sha256_of(f) != digest:
            held = sorted({k.fqn for k, info in (metadata.storage_data or {}).items()
                           if getattr(info, "relative_path", None) == rel})
            what = f" (holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''})" if held else ""
            raise CheckpointError(f"checkpoint file {f}{what} is corrupt: its sha256 differs from the one in "
                                  f"{MANIFEST}; its bytes changed after the save. Use an earlier checkpoint "
                                  f"(e.g. {LAST}.old)")


def sha256_of(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: str | Path) -> Path:
    """Write ``arlopti-manifest.json`` (sha256 of every other file) into a checkpoint folder."""
    folder = Path(folder)
    digests = {f.name: sha256_of(f) for f in sorted(folder.iterdir()) if f.is_file() and f.name != MANIFEST}
    out = folder / MANIFEST
    out.write_text(json.dumps({"sha256": digests}, indent=1, sort_keys=True) + "\n")
    return out


def run_names(log_dir: str | Path, task_name: str) -> list[str]:
    """The ``run_name`` of every run of ``task_name`` under ``log_dir`` that holds a checkpoints
    folder (``<log_dir>/<task_name>/<run_name>/<time>/checkpoints``), sorted."""
    return sorted(d.name for d in (Path(log_dir) / str(task_name)).glob("*") if any(d.glob("*/checkpoints")))


# ---------------------------------------------------------------------------------------------
# a checkpoint's run state
# ---------------------------------------------------------------------------------------------


def load_checkpoint_metadata(path: str | Path) -> dict:
    """The non-tensor part of a checkpoint (hyper-parameters, counters, loop and DataModule state).

    For a file this loads it memory-mapped on CPU; for a distributed folder it reads ``meta.pt``.
    """
    import torch

    path = validate_checkpoint(path)
    target = path / META if path.is_dir() else path
    try:
        return torch.load(target, map_location="cpu", mmap=target.is_file() and path.is_file(), weights_only=False)
    except Exception as err:
        raise CheckpointError(f"checkpoint {target} cannot be read ({type(err).__name__}: {err}); "
                              "it may be truncated or from an incompatible version") from err


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``; tuples become lists so a saved config compares equal."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def config_mismatches(saved_run: dict, run: dict) -> list[str]:
    """Human-readable differences between a checkpoint's run config and this run's, sorted by key."""
    a, b = flatten(saved_run), flatten(run)
    diffs = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            diffs.append(f"{key}: checkpoint {a.get(key, '<absent>')!r}, this run {b.get(key, '<absent>')!r}")
    return diffs


def check_resume_compatible(ckpt: str, run, allow_mismatch: bool = False, data: dict | None = None) -> None:
    """Refuse a checkpoint whose saved run config differs from ``run`` (lists every differing key),
    or whose saved data identity (``hyper_parameters.data``, ``arlopti.entry.train.data_signature``)
    differs from ``data``: resuming K&K weights and sampler state for math training is a mismatch
    too. A checkpoint saved before the data identity was recorded is resumed with a warning."""
    from dataclasses import asdict

    from arlopti.config import ConfigError, saved_run_as_current

    hparams = load_checkpoint_metadata(ckpt).get("hyper_parameters") or {}
    saved = hparams.get("run")
    if saved is None:
        raise ConfigError(f"checkpoint {ckpt} has no saved run config (hyper_parameters.run): not an arlopti "
                          "training checkpoint")
    # an older checkpoint: keys removed since are ignored, keys added since compare as their default
    diffs = config_mismatches(saved_run_as_current(saved), asdict(run))
    if data is not None:
        saved_data = hparams.get("data")
        if saved_data is None:
            log.warning("checkpoint %s records no data config (saved before it was recorded): cannot check that "
                        "it was trained on the same data (%s)", ckpt, data.get("_target_"))
        else:
            diffs += config_mismatches({"data": dict(saved_data)}, {"data": dict(data)})
    if not diffs:
        return
    listing = "\n  ".join(diffs)
    if allow_mismatch:
        log.warning("resuming from %s with a different config (allow_config_mismatch=true):\n  %s", ckpt, listing)
        return
    keys = ", ".join(d.split(":", 1)[0] for d in diffs)  # one line (entry/failures.py): the keys, then the fix
    raise ConfigError(f"checkpoint {ckpt} was saved with a different config: {'; '.join(diffs)}. Resume with the "
                      f"checkpoint's settings of {keys}, or pass allow_config_mismatch=true to resume anyway "
                      "(model.* differences will still fail to load)")


def check_checkpoint_strategy(ckpt: str, strategy) -> None:
    """Refuse a distributed-checkpoint folder (FSDP2: one shard per rank) under a trainer whose strategy
    reads single checkpoint files only (Lightning would fail with a bare ``IsADirectoryError``); only a
    ``ModelParallelStrategy`` (``trainer=fsdp``) reads such a folder."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from arlopti.config import ConfigError

    if Path(ckpt).is_dir() and not isinstance(strategy, ModelParallelStrategy):
        raise ConfigError(
            f"ckpt_path={ckpt} is a distributed-checkpoint folder (FSDP2 writes one shard per rank), and this run's "
            f"trainer ({type(strategy).__name__}) reads single checkpoint files only: resume it with trainer=fsdp, "
            f"as it was trained, or export its weights (python -m arlopti.checkpoints.export {ckpt} <out>) and start "
            "a new run from them (model.name_or_path=<out>)")


def finished_reason(ckpt: str, rollout_steps: int | None, max_epochs: int | None) -> str | None:
    """Why a run resumed from ``ckpt`` would have nothing left to do, or None.

    Done = the checkpoint's ``arlopti.rollout_step`` >= ``rollout_steps``, or its epochs >=
    ``max_epochs`` (completed epochs, plus the current one when the checkpoint was saved on that
    epoch's last batch, as the final save is). Lightning's stop check only runs after a step, so
    resuming such a run would otherwise train one more step and save it.
    """
    meta = load_checkpoint_metadata(ckpt)
    step = int((meta.get("arlopti") or {}).get("rollout_step", 0))
    if rollout_steps is not None and step >= int(rollout_steps):
        return f"checkpoint is at rollout step {step} and rollout_steps={rollout_steps}"
    if max_epochs is not None and int(max_epochs) >= 0:
        fit = (meta.get("loops") or {}).get("fit_loop") or {}
        epochs = int(((fit.get("epoch_progress") or {}).get("current") or {}).get("completed", 0))
        batches = fit.get("epoch_loop.batch_progress") or {}
        current = batches.get("current") or {}
        if batches.get("is_last_batch") and current.get("processed", 0) >= max(1, current.get("ready", 0)):
            epochs = max(epochs, int(meta.get("epoch", epochs)) + 1)
        if epochs >= int(max_epochs):
            return (f"checkpoint has finished {epochs} epoch(s) (rollout step {step}) and "
                    f"trainer.max_epochs={max_epochs}")
    return None


__all__ = ["LAST", "MANIFEST", "META", "RESOLVED_ENV", "CheckpointError", "CheckpointNotFoundError",
           "check_resume_compatible", "config_mismatches", "find_last_checkpoint", "finished_reason",
           "inherited_answer", "last_candidates", "last_checkpoint_candidates", "last_in", "load_checkpoint_metadata",
           "named_checkpoint", "resolve_ckpt_path", "run_names", "sha256_of", "validate_checkpoint", "write_manifest"]
