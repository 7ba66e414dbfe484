"""A command line Hydra could not compose, said in one line with the fix.

Hydra's report of ``algorithm.lopti.enabld=true`` is seven lines that end in the wrong advice
(``+algorithm.lopti.enabld=true`` would add a key nothing reads). :func:`composition_error` turns the
two mistakes a user makes by hand into one :class:`~arlopti.config.ConfigError` line:

* a key no config has: the closest key of the composed config (``difflib``, among its siblings first;
  :func:`arlopti.config.check.unknown_key_message`), or the group option that has it
  (``task.reward_fns`` needs ``task=custom``);
* a group option with no file (``experiment=kk_lopi``): the closest option, or the options.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from omegaconf import DictConfig

from arlopti.config import ConfigError
from arlopti.config.check import close_match, unknown_key_message

_NOT_OVERRIDDEN = re.compile(r"^Could not override '([^']+)'")


def config_keys(node: DictConfig, where: str = "") -> Iterator[str]:
    """Every dotted key of ``node``, depth first, without resolving any interpolation."""
    for name in node.keys():
        key = f"{where}.{name}" if where else str(name)
        yield key
        child = node._get_node(name)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_interpolation():
            yield from config_keys(child, key)


def known_keys(lines: Sequence[str], config_name: str) -> list[str]:
    """The keys of the config these overrides compose (Hydra's own node included), or of the bare
    config when they do not compose either; and the group names of the config folder."""
    from hydra import compose
    from hydra.errors import ConfigCompositionException

    from arlopti.config.compose import default_config_dir, hydra_context

    with hydra_context(config_name=config_name):
        try:
            cfg = compose(config_name, overrides=list(lines), return_hydra_config=True)
        except ConfigCompositionException:
            cfg = compose(config_name, overrides=[], return_hydra_config=True)
    groups = [p.name for p in default_config_dir().iterdir() if p.is_dir()]
    return sorted(set(config_keys(cfg)) | set(groups))


def _has_key(node, parts: Sequence[str]) -> bool:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def option_with_key(key: str) -> str | None:
    """``group=option`` of the first option file of ``key``'s group that holds the rest of the key
    (``task.reward_fns`` -> ``task=custom``), or None."""
    import yaml

    from arlopti.config.compose import default_config_dir

    group, _, rest = key.partition(".")
    folder = default_config_dir() / group
    if not rest or not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.yaml")):
        if _has_key(yaml.safe_load(path.read_text()) or {}, rest.split(".")):
            return f"{group}={path.stem}"
    return None


def _line_of(key: str, lines: Sequence[str]) -> str:
    return next((line for line in lines if line.lstrip("+~").split("=", 1)[0] == key), key)


def unknown_key_error(key: str, lines: Sequence[str], config_name: str,
                      shown: Sequence[str] | None = None) -> ConfigError:
    """The one line for an override of ``key``, which the composed config does not have (``shown``: the
    overrides as the user wrote them, a sweep's every value)."""
    line = _line_of(key, lines)
    shown_line = _line_of(key, shown or lines)
    option = option_with_key(key)
    if option is not None and option not in lines:
        return ConfigError(f"{shown_line}: `{key}` is a key of `{option}`; add {option} to the command line")
    known = known_keys([other for other in lines if other != line], config_name)
    return ConfigError(unknown_key_message(shown_line, key, known))


def missing_option_error(err) -> ConfigError | None:
    """``group=option`` naming no ``configs/<group>/<option>.yaml``: the closest option, else the options."""
    group, _, option = str(err.missing_cfg_file or "").rpartition("/")
    options = list(err.options or [])
    if not group or not options:
        return None
    match = close_match(option, options)
    fix = f"did you mean `{group}={match}`?" if match else f"choose one of: {', '.join(options)}"
    return ConfigError(f"{group}={option}: configs/{group} has no {option}.yaml; {fix}")


def composition_error(err: Exception, lines: Sequence[str], config_name: str,
                      shown: Sequence[str] | None = None) -> ConfigError | None:
    """The one-line :class:`ConfigError` for Hydra's composition error ``err`` of the overrides ``lines``
    (``shown``: as the user wrote them), or None for an error this module does not explain (Hydra
    reports it then)."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(err, MissingConfigException):
        return missing_option_error(err)
    found = _NOT_OVERRIDDEN.match(str(err))
    if found is not None and isinstance(err.__cause__, (ConfigAttributeError, ConfigKeyError)):
        return unknown_key_error(found.group(1), lines, config_name, shown)
    return None


__all__ = ["composition_error", "config_keys", "known_keys", "missing_option_error", "option_with_key"]
