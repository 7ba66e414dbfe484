"""ConfigToLoggers (arlopti/callbacks/run_config.py): the config logged is resolved."""

from __future__ import annotations

import arlopti  # noqa: F401  (the run_label resolver)
from arlopti.callbacks.run_config import config_text, run_identity


def test_logged_config_is_resolved_and_identity_read(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("seed: 3\ntask_name: kk\nalgorithm: {advantage: rloo, ar_alpha: 0.0, lopti: {enabled: false, "
                    "eta: 0.5}}\nrun_name: ${run_label:${algorithm},0,${seed}}\n")
    text = config_text(str(path), {})
    assert "run_name: rloo_s3" in text and "${" not in text
    assert run_identity(str(path)) == {"seed": 3, "task_name": "kk"}
    bad = tmp_path / "unresolvable.yaml"
    bad.write_text("out: ${hydra:runtime.output_dir}\n")
    assert config_text(str(bad), {}) == bad.read_text()  # as saved when it cannot be resolved here
