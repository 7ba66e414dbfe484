"""A run folder of its own: ``${exclusive_dir:<path>}`` claims ``<path>``, or the next free ``<path>_<n>``.

``configs/hydra/default.yaml`` names a run's folder ``logs/<task_name>/<run_name>/<time to the second>``
(and a multirun's ``logs/<task_name>/multiruns/<time>``). Two runs of one experiment started within
the same second would share it: the second ``last.ckpt`` replaces the first, their ``train.log`` lines
interleave. The folder is therefore created here, exclusively (``mkdir`` without ``exist_ok``, atomic
on a POSIX file system, so two processes racing for one name get one each): on a clash the next free
name is taken, ``<time>_1``, ``<time>_2``, ... (as Hydra numbers a multirun's jobs).

The resolver is registered with ``use_cache=True``: OmegaConf then resolves it once per config, and
Hydra copies that cache into every job config of a multirun (``load_sweep_config``) and the ranks
Lightning starts receive the resolved path (``hydra.run.dir=<it>``), so one run never claims two
folders. An explicit ``hydra.run.dir=...`` (a job script, a requeued job) is used as given, shared.

``${work_root:}``: where runs go by default (``paths.log_dir`` is ``<it>/logs``): the project the user works
in, found from the working folder as lightning-hydra-template's ``rootutils`` finds it, by a marker
(:data:`ROOT_MARKERS`) in the working folder or a folder above it; the working folder itself when none
has one. Inside the checkout that is the checkout (it holds ``.project-root``), so ``logs/`` stays where it
was; ``arlopti train`` started in ``~/my_project`` writes ``~/my_project/logs``, never into the checkout.

``${task_log_suffix:}``: in a submitit job of several tasks (one per GPU, ``hydra/launcher=slurm``) every
task runs the job in the same folder; task ``n > 0`` logs to ``train_rank<n>.log`` so that rank 0's
``train.log`` stays its own. Empty everywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The one key that says where runs go (configs/paths/default.yaml): ``<it>/<task_name>/<run_name>/<time>/``.
OUTPUT_KEY = "paths.log_dir"
#: TRL's name for it (``GRPOConfig.output_dir``), read as :data:`OUTPUT_KEY` on the command line.
OUTPUT_ALIAS = "output_dir"

#: Files or folders that mark a project's root (lightning-hydra-template's ``.project-root``, a git checkout).
ROOT_MARKERS = (".project-root", ".git")

#: Names tried after ``<path>`` itself (``<path>_1`` ... ``<path>_<MAX_SUFFIX>``) before giving up.
MAX_SUFFIX = 10_000


def claim_dir(path: str) -> str:
    """Create ``path`` (parents too) if no one has, else the first free ``path_<n>``; return the
    folder created. Raises :class:`FileExistsError` when ``path`` exists as a file's parent that
    cannot hold folders, or when every name up to ``MAX_SUFFIX`` is taken."""
    base = Path(str(path))
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(MAX_SUFFIX + 1):
        candidate = base if n == 0 else base.with_name(f"{base.name}_{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return str(candidate)
    raise FileExistsError(f"{base}: this run folder and {MAX_SUFFIX} numbered ones beside it already exist; "
                          "clear old runs or pass hydra.run.dir=<a new folder>")


def find_work_root(start: str | Path | None = None, markers: tuple[str, ...] = ROOT_MARKERS) -> Path:
    """The first of ``start`` (default: the working folder) and its parents that holds one of ``markers``;
    ``start`` itself when none does (the module docstring's ``${work_root:}``)."""
    here = Path.cwd() if start is None else Path(start).expanduser()
    here = here.resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in markers):
            return folder
    return here


def work_root() -> str:
    """``${work_root:}``: :func:`find_work_root` of the working folder, as a string."""
    return str(find_work_root())


def task_log_suffix() -> str:
    """``_rank<n>`` for task ``n > 0`` of a submitit job, else ``""`` (module docstring)."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return ""
    rank = os.environ.get("SLURM_PROCID") or os.environ.get("SUBMITIT_LOCAL_GLOBALID") or "0"
    return "" if rank == "0" else f"_rank{rank}"


__all__ = ["MAX_SUFFIX", "ROOT_MARKERS", "claim_dir", "find_work_root", "task_log_suffix", "work_root"]
