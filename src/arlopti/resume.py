"""Where a run resumes from: ``ckpt_path`` resolved to a complete checkpoint, on plain paths.

A run writes under ``<log_dir>/<task_name>/<run_name>/<time>/`` (Hydra's run directory, its
``output_dir``; ``run_name`` says α, η and the seed, see :mod:`arlopti.run_name`), and its
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

Wherever ``last.ckpt`` is looked for, a ``last.ckpt.old`` left by a save interrupted mid-rename
counts too (:func:`last_in`). The result is checked to be complete (:func:`validate_checkpoint`:
a truncated file or shard is named, without loading any weight). Rank 0's answer for ``last`` is
exported as ``ARLOPTI_RESOLVED_CKPT``, so that the ranks Lightning launches from it resume from
the same checkpoint rather than search again (a rank could otherwise find a checkpoint written
since). Nothing here needs Hydra: the caller passes the directories as values
(:func:`arlopti.train.resolve_ckpt_path` reads them from the composed config).
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

LAST = "last.ckpt"
META = "meta.pt"  # Lightning's metadata file inside a distributed-checkpoint folder
# rank 0's answer for ckpt_path=last, inherited by the ranks it launches
RESOLVED_ENV = "ARLOPTI_RESOLVED_CKPT"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the file and what to do."""


def last_in(checkpoints: Path) -> Path | None:
    """``checkpoints/last.ckpt``, else the ``last.ckpt.old`` a save interrupted mid-rename left."""
    for name in (LAST, LAST + ".old"):
        p = Path(checkpoints) / name
        if p.is_file() or (p.is_dir() and (p / META).is_file()):
            return p
    return None


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


def resolve_ckpt_path(ckpt_path: str | Path | None, *, output_dir: str | Path | None = None,
                      log_dir: str | Path | None = None, task_name: str | None = None,
                      run_name: str | None = None) -> str | None:
    """The checkpoint ``ckpt_path`` names (see the module docstring), checked to be complete.

    ``output_dir`` is this run's directory (None when unknown); ``log_dir``, ``task_name`` and
    ``run_name`` locate the earlier runs that ``last`` searches. An explicit path needs none of them.
    """
    if ckpt_path in (None, ""):
        return None
    ckpt_path = str(ckpt_path)
    if ckpt_path == "auto":
        path = last_in(Path(output_dir) / "checkpoints") if output_dir is not None else None
        if path is None:
            log.info("ckpt_path=auto: no checkpoint in this run directory; starting from scratch")
            return None
    elif ckpt_path == "last":
        inherited = os.environ.get(RESOLVED_ENV)
        if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
            return inherited  # a rank Lightning started: use what rank 0 found, not a fresh search
        path = find_last_checkpoint(output_dir, log_dir, task_name, run_name)
        if path is None:
            own = f"{output_dir}/checkpoints" if output_dir is not None else "<this run>/checkpoints"
            raise FileNotFoundError(
                f"ckpt_path=last: no last.ckpt under {own} nor under any earlier run of "
                f"task_name={task_name}, run_name={run_name} in {log_dir}/{task_name}/{run_name}; "
                "pass an explicit ckpt_path")
    else:
        path = _named_checkpoint(ckpt_path)
    validate_checkpoint(path)
    os.environ[RESOLVED_ENV] = str(path)
    return str(path)


def _named_checkpoint(ckpt_path: str) -> Path:
    """An explicit ``ckpt_path``: a checkpoint file or folder, or a run directory (its last.ckpt)."""
    path = Path(ckpt_path)
    if not path.exists():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist")
    if path.is_dir() and (path / "checkpoints").is_dir():  # a run directory
        found = last_in(path / "checkpoints")
        if found is None:
            raise FileNotFoundError(
                f"ckpt_path={ckpt_path!r} is a run directory without checkpoints/last.ckpt")
        return found
    return path


def validate_checkpoint(path: str | Path) -> Path:
    """Check that ``path`` is a complete checkpoint (file or distributed folder) without loading weights.

    Raises :class:`CheckpointError` naming the offending file: a truncated or non-zip file, a
    folder without its metadata, or a shard shorter than its metadata says.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_file():
        _check_file(path)
    else:
        _check_folder(path)
    return path


def _check_file(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({err}); it was probably cut off "
                              f"by a crash during a save: use an earlier checkpoint (e.g. {LAST}.old)") from err
    if not any(n.endswith("data.pkl") for n in names):
        raise CheckpointError(f"checkpoint file {path} is a zip archive but not a torch checkpoint")


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


__all__ = ["LAST", "META", "RESOLVED_ENV", "CheckpointError", "find_last_checkpoint", "last_in",
           "resolve_ckpt_path", "validate_checkpoint"]
