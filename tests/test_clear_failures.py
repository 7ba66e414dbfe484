"""Failures that were loud but unclear (issues 24, 33, 37), each through ``python train.py``'s own entry
point (:func:`helpers.train_cli.run_train_cli`, in this process): the exit status and the message naming
the key, the folder or the tensor, and nothing else on the console: no "Error executing job" report, no
traceback (that is in ``train.log``, and on the console with ``HYDRA_FULL_ERROR=1``). The mlflow start-up
check is in tests/loggers/test_factories.py, Ctrl-C in tests/callbacks/test_checkpointing.py (in-process,
where the resumed run can be compared bit for bit) and tests/entry/test_api.py (``arlopti.run``).
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers.train_cli import run_train_cli


@pytest.mark.parametrize("lr", ["1e38", "1e300", "nan", "inf"])
def test_a_learning_rate_that_is_not_a_finite_float32_is_refused_naming_the_key(lr, tmp_path):
    code, err = run_train_cli(tmp_path, f"optim.lr={lr}")
    assert code == 1
    shown = lr if lr in ("nan", "inf") else repr(float(lr))
    assert f"optim.lr={shown}" in err and ("finite float" in err or "is too large" in err), err[-2000:]
    assert "value cannot be converted" not in err  # torch's overflow, deep in AdamW, is not what the user sees
    assert one_line(err).startswith("ConfigError: optim.lr=")


def one_line(err: str) -> str:
    """The console's report of a failure: exactly one line, no Hydra report, no traceback."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err[-3000:]
    assert "Error executing job" not in err and "Traceback" not in err and "HYDRA_FULL_ERROR" not in err
    return lines[0]


def test_the_traceback_is_in_train_log_and_on_the_console_with_hydra_full_error(tmp_path, monkeypatch):
    code, err = run_train_cli(tmp_path / "a", "optim.lr=1e38")
    assert code == 1 and one_line(err).startswith("ConfigError: optim.lr=1e+38 is too large")
    log = (tmp_path / "a" / "run" / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and "ConfigError: optim.lr=1e+38 is too large" in log
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra's own report, the whole traceback
    code, err = run_train_cli(tmp_path / "b", "optim.lr=1e38")
    assert code == 1 and "Traceback (most recent call last)" in err and "validate_once" in err


def test_lora_modules_to_save_vllm_cannot_serve_as_an_adapter_are_refused_at_start_up(tmp_path):
    """vLLM would refuse it in its peft_helper at the first sync; here before any model loads."""
    code, err = run_train_cli(tmp_path, "rollout=vllm", "rollout.lora_sync=adapter", "model.lora.r=4",
                              "model.lora.modules_to_save=[norm]")
    assert code == 1
    line = one_line(err)
    assert line.startswith("ConfigError: model.lora.modules_to_save=['norm'] with rollout.lora_sync=adapter")
    assert "rollout.lora_sync=merged" in line and "model.lora.modules_to_save=[]" in line
    assert "LoRA r=4" not in (tmp_path / "run" / "train.log").read_text()  # no model was wrapped


def test_an_incompatible_checkpoint_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    """The checkpoint's run config differs (optim.lr): refused naming the key, and the tokenizer, the
    policy and the reference are never loaded (they would raise here)."""
    from dataclasses import asdict

    import arlopti.learner.module
    import arlopti.models.loading
    from arlopti.entry.train import run_config
    from helpers.compose import compose_train
    from helpers.train_cli import SMOKE

    saved = asdict(run_config(compose_train(list(SMOKE) + ["optim.lr=0.5"], tmp_path)))
    ckpt = tmp_path / "other.ckpt"
    torch.save({"hyper_parameters": {"run": saved}, "state_dict": {}}, ckpt)

    def loaded(*a, **k):
        raise AssertionError("a model or tokenizer was loaded before the checkpoint was checked")

    monkeypatch.setattr(arlopti.models.loading, "load_tokenizer", loaded)
    monkeypatch.setattr(arlopti.learner.module, "GRPOModule", loaded)
    code, err = run_train_cli(tmp_path, f"ckpt_path={ckpt}")
    assert code == 1
    line = one_line(err)  # one line, however many keys differ: the keys, then the fix
    assert line.startswith(f"ConfigError: checkpoint {ckpt} was saved with a different config: "), line
    assert "optim.lr: checkpoint 0.5, this run 1e-06" in line, err[-2000:]
    assert "Resume with the checkpoint's settings of optim.lr, or pass allow_config_mismatch=true" in line


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


@pytest.mark.process


def test_a_failing_reward_function_stops_the_run_in_one_line(tmp_path):
    """RewardFailureError through train.py: one line naming the function, the setting and the error, rc 1;
    the user's traceback is in train.log (logged once, before the error)."""
    from helpers.varied_reward import varied_task

    reward = tmp_path / "broken.py"
    reward.write_text("def score(response, ground_truth, meta):\n    raise KeyError('answer')\n")
    task = [o if not o.startswith("task.reward_fn=") else f"task.reward_fn={reward}:score"
            for o in varied_task(tmp_path / "task")]
    code, err = run_train_cli(tmp_path, *task, smoke=("debug=smoke", "~callbacks.benchmark_eval",
                                                      "~callbacks.rich_progress_bar", "logger=none"))
    assert code == 1
    line = one_line(err)
    assert line.startswith(f"RewardFailureError: the reward function {reward}:score failed on ") and \
        "task.max_error_frac=" in line and "First error (its traceback is logged above): KeyError: 'answer'" in line
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count(f'{reward}", line 2, in score') == 1  # the user's traceback


@pytest.mark.process


def test_a_learning_rate_that_diverges_stops_in_one_line_naming_the_cause_and_a_checkpoint(tmp_path):
    """Issue 42: ``optim.lr=1e30`` warned at the first step (the update 1e28 x the weights' norm), ran on to
    ``kl nan``, and the diagnostics callback died with ``index -9223372036854775808 is out of bounds``,
    saving nothing. Now (a ``python train.py`` process of its own, the tiny model, diagnostics on) the run
    stops in one line that names the cause and the fix, with the last finite weights saved and named."""
    import re
    import subprocess
    import sys

    from helpers.train_cli import REPO, SMOKE

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "train.py", "experiment=kk_lopti", *SMOKE, "optim.lr=1e30", "rollout_steps=6",
                           f"paths.log_dir={tmp_path}/logs", f"hydra.run.dir={tmp_path}/run"],
                          cwd=REPO, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_line(proc.stderr)
    assert line.startswith("NonFiniteAbort: ") and "(cause: optim.lr=1e+30: the first optimizer step moved the " \
        "weights by" in line and "ower optim.lr" in line, line
    assert "out of bounds" not in proc.stdout + proc.stderr and "kl nan" not in proc.stdout
    saved = re.search(r"The last finite weights \(after rollout step (\d+)\) are saved in (\S+)\.$", line)
    assert saved, line
    ckpt = torch.load(saved.group(2), map_location="cpu", weights_only=False)
    assert ckpt["arlopti"]["rollout_step"] == int(saved.group(1)) >= 1
    assert all(bool(v.isfinite().all()) for v in ckpt["state_dict"].values() if torch.is_floating_point(v))
