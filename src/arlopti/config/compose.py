"""The one Hydra set-up of the project: where ``configs/`` is, and how a config is composed or a job run.

Every entry point goes through here: ``train.py`` and ``eval.py`` (``@hydra.main`` on
:func:`prepare`'s folder), :func:`arlopti.run` (:func:`run_job`, Hydra's own run path), the
previews and the rollout worker (:func:`compose`). :func:`prepare` registers the group schemas and
the resolvers (importing :mod:`arlopti.config` does both) and sets ``PROJECT_ROOT`` (which
``paths.root_dir`` interpolates) to the folder above ``configs/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import arlopti.config  # noqa: F401  (registers the group schemas and the resolvers)


def default_config_dir() -> Path:
    """``$PROJECT_ROOT/configs`` when set, else the checkout's ``configs`` (this file lives in
    ``<root>/src/arlopti/config``), else ``./configs``."""
    if os.environ.get("PROJECT_ROOT"):
        return Path(os.environ["PROJECT_ROOT"]) / "configs"
    here = Path(__file__).resolve().parents[3] / "configs"
    return here if (here / "train.yaml").is_file() else Path.cwd() / "configs"


def prepare(config_dir: str | Path | None = None, config_name: str = "train.yaml") -> Path:
    """The absolute config folder (``config_dir`` or :func:`default_config_dir`), checked to hold
    ``config_name``; sets ``PROJECT_ROOT`` to its parent unless already set."""
    folder = (Path(config_dir) if config_dir is not None else default_config_dir()).resolve()
    if not (folder / (config_name if config_name.endswith(".yaml") else config_name + ".yaml")).is_file():
        raise FileNotFoundError(f"{folder} holds no {config_name}: set PROJECT_ROOT to your arlopti checkout "
                                "(or pass --config-dir <checkout>/configs)")
    os.environ.setdefault("PROJECT_ROOT", str(folder.parent))
    return folder


@contextmanager
def hydra_context(config_dir: str | Path | None = None, job_name: str | None = None,
                  config_name: str = "train.yaml") -> Iterator[Path]:
    """Hydra initialised on the config folder for the ``with`` block, cleared before and after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = prepare(config_dir, config_name)
    GlobalHydra.instance().clear()
    try:
        # a job name of its own: Hydra would otherwise look for one in the caller's stack frame
        name = job_name or Path(config_name).stem
        with initialize_config_dir(version_base="1.3", config_dir=str(folder), job_name=name):
            yield folder
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: Sequence[str] = (), config_name: str = "train.yaml", config_dir: str | Path | None = None):
    """The composed config (``train.yaml`` by default) for these Hydra overrides, without a Hydra run."""
    from hydra import compose as hydra_compose

    with hydra_context(config_dir, config_name=config_name):
        return hydra_compose(config_name, overrides=list(overrides))


def override_value(value, sep: str = ",") -> str:
    """``value`` as a Hydra override writes it: ``null``, ``true`` / ``false``, ``[a<sep>b]`` for a list or a
    tuple (its items likewise), anything else as ``str`` (a float's shortest round-trip form)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + sep.join(override_value(v, sep) for v in value) + "]"
    return str(value)


def quoted(text) -> str:
    """``text`` (a path, any string) as a quoted Hydra override value: spaces, ``,`` and ``=`` are then safe."""
    return "'" + str(text).replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_job(task_function: Callable, overrides: Sequence[str], config_name: str = "train.yaml",
            job_name: str = "train", config_dir: str | Path | None = None) -> None:
    """Run ``task_function(cfg)`` as one Hydra job, exactly as ``@hydra.main`` would (run folder,
    ``.hydra/``, logging)."""
    from hydra.core.global_hydra import GlobalHydra

    with hydra_context(config_dir, job_name=job_name, config_name=config_name):
        GlobalHydra.instance().hydra.run(config_name, task_function, list(overrides))


__all__ = ["compose", "default_config_dir", "hydra_context", "override_value", "prepare", "quoted", "run_job"]
