"""Issue 54 item 7: README's "Coming from TRL or verl" table is true.

Every row that offers something (not **missing**) names keys that exist: a dotted key is in the composed
config of one of the configurations the table talks about (the schema's groups, ``task=custom``'s reward
keys, ``data=prompts``, ...) or in a file of its group; ``group=option`` names a file. The table once said
learned reward models were missing while docs/custom_task.md documented ``task.reward_model``: that row must
now name the key, and no row may call something missing that the config has.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
_KEY = re.compile(r"^[a-z_]+(?:\.[a-z_0-9]+)+$")
_CHOICE = re.compile(r"^([a-z_]+)=([a-z_0-9.\-]+)$")
_ABSENT = object()
#: The configurations the table's keys come from (each composed once).
VARIANTS = ([], ["task=custom", "data=prompts"], ["data=verl_parquet"], ["rollout=vllm"])


def table_rows() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    block = text.split("**Coming from TRL or verl.**", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    out = []
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        out.append((cells[0], cells[1]))
    return out


@pytest.fixture(scope="module")
def configs():
    from arlopti.config.compose import compose

    return [compose(v) for v in VARIANTS]


def _in_group_files(key: str) -> bool:
    group, _, rest = key.partition(".")
    for path in (CONFIGS / group).glob("*.yaml"):
        node = yaml.safe_load(path.read_text()) or {}
        for part in rest.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            return True
    return False


def key_exists(key: str, configs) -> bool:
    from arlopti.config import field_types

    if key in {k for k, _, _ in field_types()}:
        return True
    if any(OmegaConf.select(c, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT
           for c in configs):
        return True
    return _in_group_files(key)


def named_keys(cell: str) -> list[str]:
    """The config keys and ``group=option`` choices a cell names in backticks (values after ``=`` dropped
    for keys)."""
    out = []
    for code in re.findall(r"`([^`]+)`", cell):
        head = code.split("=", 1)[0]
        if _CHOICE.match(code) and "." not in head:
            if (CONFIGS / head).is_dir():  # a group choice; `num_labels=1` and the like are no config's
                out.append(code)
        elif _KEY.match(head):
            out.append(head)
    return out


def test_the_table_has_its_rows():
    rows = table_rows()
    assert len(rows) >= 20
    assert any("reward_funcs" in trl for trl, _ in rows) and any("output_dir" in trl for trl, _ in rows)


def test_every_offered_row_names_keys_that_exist(configs):
    checked = 0
    for trl, ours in table_rows():
        if ours.startswith("**missing**"):
            continue
        for name in named_keys(ours):
            if "=" in name:
                group, option = name.split("=")
                assert (CONFIGS / group / f"{option}.yaml").is_file(), f"row {trl!r}: {name} names no config file"
            else:
                assert key_exists(name, configs), f"row {trl!r}: {name} is no key of the config"
            checked += 1
    assert checked >= 30


def test_learned_reward_models_and_the_output_folder_are_offered():
    rows = dict(table_rows())
    reward_model = next(ours for trl, ours in rows.items() if "a learned reward model" in trl)
    assert not reward_model.startswith("**missing**") and "`task.reward_model`" in reward_model
    output = next(ours for trl, ours in rows.items() if trl == "`output_dir`")
    assert "`paths.log_dir`" in output


def test_a_misnamed_key_would_be_caught(configs):
    assert not key_exists("task.reward_modle", configs) and not key_exists("sizes.group_sise", configs)
    assert key_exists("task.reward_weights", configs) and key_exists("rollout.server.urls", configs)
