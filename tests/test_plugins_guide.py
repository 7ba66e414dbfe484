"""docs/plugins.md runs as written: a policy loss registered from the user's own module trains the tiny
model 2 steps under Lopti through ``arlopti.run`` and through ``python train.py plugins=[...]``, with no file
under ``src/`` touched.

The page is run as docs/custom_task.md is (``test_custom_task_guide.guide_script``): ``file=`` blocks are
written, ``bash`` blocks run, in a temporary folder standing for the checkout's root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_custom_task_guide import guide_blocks, run_guide

GUIDE = REPO_ROOT / "docs" / "plugins.md"


def test_guide_registers_a_loss_and_names_it():
    blocks = guide_blocks(GUIDE.read_text())
    assert [p for _, _, p in blocks if p] == ["my_losses.py", "train_my_loss.py"]
    script = next(body for _, body, p in blocks if p == "train_my_loss.py")
    assert "import my_losses" in script and "algorithm.policy_loss=truncated_is" in script


@pytest.mark.slow
def test_plugins_guide_runs_as_written(tmp_path):
    proc = run_guide(GUIDE, tmp_path, ("configs", "train.py"))
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"run_dir"')]
    result = json.loads(line)
    run_dir = Path(result["run_dir"])
    assert run_dir.parent.name.startswith("truncated_is_e0.5"), run_dir
    assert "policy_loss: truncated_is" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert result["steps"] >= 1  # optimizer steps of the last rollout step (both phases when both have tokens)
    (cli_run,) = (tmp_path / "logs" / "my_loss_cli").iterdir()  # the command line's run, the same loss
    assert cli_run.name.startswith("truncated_is_e0.5")
    (when,) = cli_run.iterdir()
    assert "policy_loss: truncated_is" in (when / ".hydra" / "config.yaml").read_text()


def test_the_command_line_refuses_an_unregistered_loss():
    """What the page says train.py cannot do: the config check names the loss and the known ones."""
    from arlopti.config import ConfigError, RunConfig, validate_run

    cfg = RunConfig()
    cfg.algorithm.policy_loss = "truncated_is_not_registered"
    with pytest.raises(ConfigError, match="algorithm.policy_loss='truncated_is_not_registered'.*ppo_clip.*"
                                          r"plugins=\[my_module\] \(docs/plugins.md\)"):
        validate_run(cfg)


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(tmp_path, monkeypatch):
    from arlopti.config import ConfigError
    from arlopti.entry.train import import_plugins

    monkeypatch.chdir(tmp_path)
    (tmp_path / "good_losses.py").write_text("REGISTERED = True\n")
    assert import_plugins(["good_losses", "good_losses.py"]) == ["good_losses", "good_losses.py"]
    assert import_plugins(None) == [] and import_plugins([]) == []
    with pytest.raises(ConfigError, match="plugins: 'no_such_module': cannot import no_such_module"):
        import_plugins(["no_such_module"])
    with pytest.raises(ConfigError, match="plugins: 'missing.py': file .* does not exist"):
        import_plugins("missing.py")
    with pytest.raises(ConfigError, match="is not a module: give an import path"):
        import_plugins(["my_losses:fn"])
