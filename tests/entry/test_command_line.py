"""Issue 54 items 1, 2 and 5: what ``arlopti train`` / ``arlopti eval`` do with a command line before Hydra.

Where runs go (one key, ``paths.log_dir``; TRL's ``output_dir`` read as it; the project the user works in
by default), a misspelt key as one line with the closest real key, and a ``--help`` page with a usage
line, examples, the output and reward keys and only the groups the command reads. Before the issue,
``output_dir=runs`` was Hydra's error, a run started in ``~/proj`` wrote into the checkout's ``logs/``,
``algorithm.lopti.enabld=true`` was Hydra's seven lines advising ``+key=`` and ``--help`` was a
313-line config dump.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from arlopti.config import ConfigError
from arlopti.entry import cli
from helpers.train_cli import run_train_cli

REPO = Path(__file__).resolve().parents[2]


def _refusal(argv, config_name="train.yaml") -> str:
    with pytest.raises(SystemExit) as done:
        cli.prepare_command_line(argv, config_name)
    return str(done.value.code)


# ---- item 1: where runs go --------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["output_dir=runs"], ["+output_dir=runs"], ["++output_dir=runs"],
                                  ["--output_dir", "runs"], ["--output_dir=runs"], ["--output-dir", "runs"]])
def test_trls_output_dir_is_the_output_key(argv):
    assert cli.translate_output_dir(["debug=smoke", *argv]) == ["debug=smoke", "paths.log_dir=runs"]


def test_an_output_dir_flag_without_a_folder_is_one_line():
    message = _refusal(["--output_dir"])
    assert message.startswith("ConfigError: --output_dir: give the folder") and "paths.log_dir" in message


def test_the_work_root_is_the_first_folder_up_with_a_marker_else_the_working_folder(tmp_path):
    from arlopti.config.run_dir import find_work_root

    project, bare = tmp_path / "proj", tmp_path / "bare"
    (project / "notebooks").mkdir(parents=True)
    (project / ".project-root").write_text("")
    bare.mkdir()
    assert find_work_root(project / "notebooks") == project.resolve()
    assert find_work_root(bare, markers=(".project-root",)) == bare.resolve()
    assert find_work_root(REPO / "src" / "arlopti") == REPO  # the checkout holds .project-root


def test_runs_started_outside_the_checkout_go_under_the_working_folder(tmp_path, monkeypatch):
    from arlopti.config.compose import compose

    monkeypatch.chdir(tmp_path)
    assert compose([]).paths.log_dir == f"{tmp_path.resolve()}/logs"
    monkeypatch.chdir(REPO / "docs")
    assert compose([]).paths.log_dir == f"{REPO}/logs"
    assert compose(["paths.log_dir=/elsewhere"]).paths.log_dir == "/elsewhere"


# ---- item 2: an unknown key is one line with the fix, before Hydra --------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["algorithm.lopti.enabld=true"], "algorithm.lopti.enabld=true: no such key; did you mean `algorithm.lopti.enabled`?"),
    (["optim.lrr=1e-5"], "optim.lrr=1e-5: no such key; did you mean `optim.lr`?"),
    (["rollout_step=3"], "rollout_step=3: no such key; did you mean `rollout_steps`?"),
    (["trainer.devicez=2"], "trainer.devicez=2: no such key; did you mean `trainer.devices`?"),
    (["experiment=kk_lopti", "data.val_count_per_m=1"], "did you mean `data.val_count_per_n`?"),
    (["experimnt=kk_lopti"], "did you mean `experiment`?"),
    (["experiment=kk_lopi"], "experiment=kk_lopi: configs/experiment has no kk_lopi.yaml; did you mean "
                             "`experiment=kk_lopti`?"),
    (["task.reward_fns=[a.py:f]"], "`task.reward_fns` is a key of `task=custom`; add task=custom"),
    (["-m", "trainer.max_epochz=1,2"], "trainer.max_epochz=1,2: no such key; did you mean `trainer.max_epochs`?"),
])
def test_an_unknown_key_is_one_line_with_the_closest_key(argv, expected):
    message = _refusal(argv)
    assert message.startswith("ConfigError: ") and expected in message and "\n" not in message, message
    assert "+" not in message.split(":", 2)[-1]  # never Hydra's "use +key=" advice


def test_without_a_close_key_the_parents_keys_are_listed():
    message = _refusal(["algorithm.lopti.zzzzzz=1"])
    assert "`algorithm.lopti` has: " in message and "enabled" in message and "eta" in message


def test_eval_checks_against_its_own_config():
    assert "did you mean `eval`?" in _refusal(["evl=kk_suite"], "eval.yaml")
    cli.check_command_line(["eval=kk_suite", "ckpt_path=last"], "eval.yaml")  # real keys pass


def test_real_keys_and_added_keys_pass():
    argv = ["experiment=kk_lopti", "debug=smoke", "trainer.devices=1", "+trainer.profiler=simple",
            "hydra.run.dir=/tmp/x", "-m", "algorithm.lopti.eta=0.3,0.5"]
    assert cli.prepare_command_line(argv) == argv


def test_the_python_api_refuses_an_unknown_key_as_a_config_error():
    with pytest.raises(ConfigError, match=r"^trainer\.max_epoch=1: no such key; did you mean `trainer\.max_epochs`\?$"):
        cli.check_composes(["trainer.max_epoch=1"])


def test_the_script_prints_the_line_and_nothing_of_hydras(tmp_path):
    code, err = run_train_cli(tmp_path, "algorithm.lopti.enabld=true")
    assert code == 1
    assert err.strip() == ("ConfigError: algorithm.lopti.enabld=true: no such key; did you mean "
                           "`algorithm.lopti.enabled`?"), err


# ---- item 5: help that helps ------------------------------------------------------------------------
def test_train_help_is_a_page(capsys):
    with pytest.raises(SystemExit) as done:
        cli.prepare_command_line(["experiment=kk_lopti", "--help"])
    assert done.value.code == 0
    page = capsys.readouterr().out
    lines = page.splitlines()
    assert lines[0].startswith("usage: arlopti train ")
    assert sum(line.startswith("  arlopti train ") for line in lines) in (2, 3)
    for key in ("paths.log_dir=DIR", "output_dir=DIR", "task.reward_fn", "task.reward_fns", "task.reward_weights",
                "task.reward_model"):
        assert key in page, key
    assert "  experiment: " in page and "kk_lopti" in page and "  algorithm: " in page
    assert "== Config ==" not in page and len(lines) < 60


def test_eval_help_lists_only_the_groups_eval_reads():
    from arlopti.entry.help import script_help

    page = script_help("eval.yaml")
    groups = [line.split(":")[0].strip() for line in page.split("groups (")[1].split("\n\n")[0].splitlines()[1:]
              if line.startswith("  ") and not line.startswith("      ")]
    assert groups == ["model", "rollout", "eval", "data", "task", "paths"]
    assert page.startswith("usage: arlopti eval ") and "arlopti eval ckpt_path=last" in page


# ---- item 6: third-party progress bars quiet by default -------------------------------------------
def test_download_bars_are_off_unless_asked_for(monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    from arlopti.utils.console import quiet_download_bars

    try:
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        assert quiet_download_bars() is True
        assert not transformers_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        enable_progress_bars()
        transformers_logging.enable_progress_bar()
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # Hugging Face's switch: keep them
        assert quiet_download_bars() is False and transformers_logging.is_progress_bar_enabled()
    finally:
        enable_progress_bars()
        transformers_logging.enable_progress_bar()


# ---- item 3 (the part outside tasks/): a reward model given as a reward function --------------------
def test_a_model_folder_in_reward_fns_is_refused_naming_reward_model(tmp_path):
    rm = tmp_path / "my_rm"
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    message = _refusal(["task=custom", f"task.reward_fns=[{rm},rewards.py:brevity]"])
    assert message.startswith(f"ConfigError: task.reward_fns: {rm} is a model, not a function")
    assert f"task.reward_model={rm}" in message and "\n" not in message
    hub = _refusal(["task=custom", "task.reward_fn=OpenAssistant/reward-model-deberta-v3-large-v2"])
    assert "task.reward_model=OpenAssistant/reward-model-deberta-v3-large-v2" in hub
    for spec in ("rewards.py:score", "my_task/rewards.py", "arlopti.tasks.builtin_rewards:math"):
        assert not cli.looks_like_a_model(spec), spec
