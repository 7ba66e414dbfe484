"""Failures that were loud but unclear (issue 24, §2), each through ``python train.py``'s own entry
point: the exit status and the message naming the key, the folder or the tensor.

``run_train_cli`` runs ``train.py`` as ``__main__`` inside this process (the command-line check,
then Hydra's ``main``), so the interpreter's and torch's start-up are paid once for the file; the
exit status is what the shell would see (Hydra exits 1 on an exception, the command-line check
with its message). The mlflow start-up check is in tests/loggers/test_factories.py, Ctrl-C in
tests/callbacks/test_checkpointing.py (in-process, where the resumed run can be compared bit for bit).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[1]
SMOKE = ("debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
         "~callbacks.benchmark_eval", "~callbacks.rich_progress_bar", "logger=none")


def run_train_cli(tmp_path: Path, *overrides: str) -> tuple[int, str]:
    """``python train.py debug=smoke ... *overrides`` in this process: (exit status, stderr)."""
    argv = ["train.py", *SMOKE, f"paths.log_dir={tmp_path}/logs", f"hydra.run.dir={tmp_path}/run", *overrides]
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


@pytest.mark.parametrize("lr", ["1e38", "1e300", "nan", "inf"])
def test_a_learning_rate_that_is_not_a_finite_float32_is_refused_naming_the_key(lr, tmp_path):
    code, err = run_train_cli(tmp_path, f"optim.lr={lr}")
    assert code == 1
    shown = lr if lr in ("nan", "inf") else repr(float(lr))
    assert f"optim.lr={shown}" in err and ("finite float" in err or "is too large" in err), err[-2000:]
    assert "value cannot be converted" not in err  # torch's overflow, deep in AdamW, is not what the user sees


def test_ckpt_path_to_a_folder_without_checkpoints_says_what_was_looked_for(tmp_path):
    folder = tmp_path / "old_run"
    folder.mkdir()
    (folder / "train.log").write_text("a run folder, no checkpoints/\n")
    code, err = run_train_cli(tmp_path, f"ckpt_path={folder}")
    assert code == 1
    assert f"ckpt_path='{folder}' is a folder that holds no checkpoint. Looked for: a run directory's " \
           f"{folder}/checkpoints/last.ckpt (or last.ckpt.old), and a distributed-checkpoint folder's " \
           f"{folder}/meta.pt" in err, err[-2000:]
    assert "not a complete distributed checkpoint" not in err


def test_a_checkpoint_folder_that_cannot_be_written_is_found_at_start_up(tmp_path):
    """Under a regular file, so that root cannot write there either."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    where = blocker / "checkpoints"
    code, err = run_train_cli(tmp_path, f"callbacks.model_checkpoint.dirpath={where}")
    assert code == 1
    assert f"callbacks.model_checkpoint.dirpath={where} is not a writable folder" in err, err[-2000:]
    assert "rollout step 1" not in err  # before any training work


def test_a_validation_set_whose_every_prompt_is_too_long_is_an_error(tmp_path):
    code, err = run_train_cli(tmp_path, "data.val_max_prompt_length=8")
    assert code == 1
    assert "validation set kk_3ppl (kk): every one of its 1 prompts is longer than the validation prompt-length " \
           "limit 8 (data.val_max_prompt_length)" in err, err[-2000:]


def test_resuming_a_checkpoint_with_nan_weights_names_the_first_bad_tensor(tmp_path):
    """One real step saves last.ckpt; a NaN written into one weight; the resume (diagnostics on,
    as by default) stops at load with the tensor named, before the diagnostics callback runs."""
    code, err = run_train_cli(tmp_path / "a", "rollout_steps=1")
    assert code == 0, err[-3000:]
    (last,) = (tmp_path / "a").rglob("last.ckpt")
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    name = next(k for k, v in ckpt["state_dict"].items() if torch.is_floating_point(v) and v.dim() == 2)
    ckpt["state_dict"][name].view(-1)[3] = float("nan")
    bad = tmp_path / "poisoned.ckpt"
    torch.save(ckpt, bad)
    code, err = run_train_cli(tmp_path / "b", f"ckpt_path={bad}", "rollout_steps=2")
    assert code == 1
    assert f"the checkpoint being resumed holds non-finite weights: first bad tensor {name!r} (1 of" in err, \
        err[-3000:]
    assert "out of bounds" not in err
