"""A setting whose YAML name is a Python keyword (``rollout.async``, the field ``async_``): read under
either name, checked and documented under the YAML one, and composed by Hydra."""

from __future__ import annotations

import pytest

from arlopti.config import ConfigError, RolloutConfig, check_overrides, config_key, from_dict, walk_fields


def test_the_yaml_name_and_the_field_name_both_build_the_config():
    a = from_dict(RolloutConfig, {"placement": "server", "async": {"max_staleness": 2}}, "rollout")
    b = from_dict(RolloutConfig, {"placement": "server", "async_": {"max_staleness": 2}}, "rollout")
    assert a == b and a.async_.max_staleness == 2


def test_errors_and_docs_use_the_yaml_name():
    with pytest.raises(ConfigError, match=r"rollout.async: unknown key\(s\) \['max_stalenes'\]"):
        from_dict(RolloutConfig, {"async": {"max_stalenes": 2}}, "rollout")
    with pytest.raises(ConfigError, match="rollout.async.max_staleness=two: expected an int"):
        check_overrides(["rollout.async.max_staleness=two"])
    keys = {key for key, _, _ in walk_fields(RolloutConfig, "rollout")}
    assert "rollout.async.max_staleness" in keys and not any("async_" in k for k in keys)
    import dataclasses

    assert {config_key(f) for f in dataclasses.fields(RolloutConfig)} >= {"async", "server", "placement"}


def test_hydra_composes_the_alias_and_rejects_a_typo(tmp_path):
    from arlopti.config.compose import compose

    from conftest import REPO_ROOT

    cfg = compose(["rollout.async.max_staleness=3", "rollout.placement=server"], config_dir=REPO_ROOT / "configs")
    assert cfg.rollout["async"].max_staleness == 3
    with pytest.raises(Exception, match="max_stalenes"):
        compose(["rollout.async.max_stalenes=3"], config_dir=REPO_ROOT / "configs")
