"""``python train.py ...`` run inside the test process (tests/test_clear_failures.py, tests/entry/test_sweeps.py).

:func:`run_train_cli` runs ``train.py`` as ``__main__`` in this process (the command-line check, then
Hydra's ``main``), so the interpreter's and torch's start-up are paid once per test file; the exit
status is what the shell would see (the one-line report exits 1, the command-line check with its
message, an exception that escapes - ``HYDRA_FULL_ERROR=1`` - is printed with its traceback, status 1).
Hydra's logging set-up and the environment are restored afterwards.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import sys
import traceback
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[2]
SMOKE = ("debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
         "~callbacks.benchmark_eval", "~callbacks.rich_progress_bar", "logger=none")


def run_train_cli(tmp_path: Path, *overrides: str, smoke: tuple[str, ...] = SMOKE,
                  run_dir: bool = True) -> tuple[int, str]:
    """``python train.py <smoke> ... *overrides`` in this process: (exit status, stderr). ``run_dir``:
    pin ``hydra.run.dir`` under ``tmp_path`` (a ``-m`` sweep uses its own folder)."""
    argv = ["train.py", *smoke, f"paths.log_dir={tmp_path}/logs", *([f"hydra.run.dir={tmp_path}/run"] if run_dir else []),
            *overrides]
    err = io.StringIO()
    saved_argv, saved_env = sys.argv, dict(os.environ)
    root = logging.getLogger()  # Hydra configures logging for the job: undo it afterwards
    saved_handlers, saved_level = root.handlers[:], root.level
    sys.argv = argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    GlobalHydra.instance().clear()
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(str(REPO / "train.py"), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # sys.exit("message"): status 1, the message on stderr
            err.write(exit_.code)
            code = 1
        else:
            code = int(exit_.code or 0)
    except Exception:  # noqa: BLE001 - escaped to the interpreter (HYDRA_FULL_ERROR=1): it prints it, status 1
        traceback.print_exc(file=err)
        code = 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        GlobalHydra.instance().clear()
        for h in root.handlers:
            if h not in saved_handlers:
                h.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return code, err.getvalue()
