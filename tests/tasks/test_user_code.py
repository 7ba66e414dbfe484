"""arlopti/tasks/user_code.py: reward specs and the plain values sent back from a worker."""

from __future__ import annotations

import numpy as np
import pytest

from arlopti.tasks.user_code import BAD_TYPE, UserCodeError, parse_spec, plain, resolve_spec


def test_parse_spec_tells_files_from_import_paths(tmp_path):
    assert parse_spec("my_pkg.rewards:score") == ("my_pkg.rewards", "score", False)
    assert parse_spec("rewards.py:score") == ("rewards.py", "score", True)
    assert parse_spec("a/b:score") == ("a/b", "score", True)
    assert resolve_spec("sub/rewards.py:f", cwd=str(tmp_path)) == f"{tmp_path}/sub/rewards.py:f"
    assert resolve_spec("pkg.mod:f", cwd=str(tmp_path)) == "pkg.mod:f"
    for bad in ("rewards", "rewards.py:", "rewards.py:not-a-name", ":f"):
        with pytest.raises(UserCodeError, match="expected 'module.path:function'"):
            parse_spec(bad)


def test_plain_values():
    assert plain(1) == 1.0 and plain(True) is True and plain(np.float32(0.5)) == 0.5
    assert plain(np.bool_(False)) is False and plain(np.array(3)) == 3.0
    assert plain({"reward": np.int64(2), "ok": True}) == {"reward": 2.0, "ok": True}
    assert plain([1, 0.5], batch=True) == [1.0, 0.5]
    assert plain("x") == (BAD_TYPE, "str", "'x'")
    assert plain(None) == (BAD_TYPE, "NoneType", "None")
    assert plain({"reward": [1]})["reward"] == (BAD_TYPE, "list", "[1]")
    assert plain(1.0, batch=True) == (BAD_TYPE, "float", "1.0")
