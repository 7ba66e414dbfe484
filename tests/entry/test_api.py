"""arlopti.run's keywords become the command line's overrides (arlopti/entry/api.py); the run itself is
tested by tests/test_python_api_guide.py (docs/python_api.md)."""

from __future__ import annotations

import json

import pytest

import arlopti
from arlopti.entry.api import build_overrides, data_file
from arlopti.config import ConfigError


def score(response, ground_truth, meta):
    return 0.0


def test_keywords_become_overrides(tmp_path):
    assert build_overrides() == []
    out = build_overrides(["debug=smoke"], reward_fn="my.mod:fn")
    assert out == ["debug=smoke", "task=custom", "task.reward_fn='my.mod:fn'"]
    out = build_overrides(["task=custom"], reward_fn=[score, "r.py:g"], reward_weights=[1, 0.5])
    assert out[0] == "task=custom" and out.count("task=custom") == 1
    assert out[1].startswith("task.reward_fns=['callable:score_") and out[1].endswith(",'r.py:g']")
    assert out[2] == "task.reward_weights=[1.0,0.5]"
    rows = [{"prompt": "p", "answer": "1"}]
    out = build_overrides(train_data=rows)
    assert out[0] == "data=prompts" and out[1] == f"data.train_file='{data_file(rows)}'"
    assert json.loads(open(data_file(rows)).read()) == rows[0] and data_file(list(rows)) == data_file(rows)
    assert build_overrides(["data=verl_parquet"], train_data=str(tmp_path))[1] == f"data.train_file='{tmp_path}'"
    with pytest.raises(TypeError, match="train_data"):
        data_file(42)


def test_bad_override_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="algorithm.lopti.enabled"):
        arlopti.run(["algorithm.lopti.enabled=no"])


def test_import_arlopti_keeps_the_api_light():
    import subprocess
    import sys

    code = "import sys, arlopti; print(arlopti.run.__module__, 'torch' in sys.modules, 'lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "arlopti.entry.api" and out[1:] == ["False", "False"]
