"""What the root scripts (``train.py``, ``eval.py``) do with their command line before Hydra composes.

:func:`prepare_command_line` is their one call: ``--help`` prints :mod:`arlopti.entry.help`'s page,
TRL's ``output_dir`` becomes the output key (:func:`translate_output_dir`), and every override is checked
(:func:`check_command_line`): its type against the schema, and its key against the config it would
change, so that a misspelt key is one line with the closest real one ("did you mean ...?") instead of
Hydra's seven lines advising ``+key=``, which would add a key nothing reads.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from arlopti.config.run_dir import OUTPUT_ALIAS, OUTPUT_KEY

_ALIAS_FLAG = re.compile(r"^--output[_-]dir(?:=(.*))?$")
_ALIAS_OVERRIDE = re.compile(rf"^\+{{0,2}}{OUTPUT_ALIAS}=(.*)$")


def command_line_overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides of a ``train.py`` / ``eval.py`` command line, as Hydra's own parser reads them."""
    try:
        from hydra._internal.utils import get_args_parser

        args, rest = get_args_parser().parse_known_args(argv)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports a bad command line itself
        return []
    return list(args.overrides or []) + [a for a in rest if not a.startswith("-")]


def translate_output_dir(argv: Sequence[str]) -> list[str]:
    """``argv`` with TRL's ``output_dir=DIR`` (also ``+output_dir=DIR``, ``--output_dir DIR``,
    ``--output-dir=DIR``) written as ``paths.log_dir=DIR``: one key decides where runs go."""
    out: list[str] = []
    items = iter(argv)
    for arg in items:
        flag, override = _ALIAS_FLAG.match(arg), _ALIAS_OVERRIDE.match(arg)
        if flag is not None:
            value = flag.group(1) if flag.group(1) is not None else next(items, None)
            if value is None:
                from arlopti.config import ConfigError

                raise ConfigError(f"{arg}: give the folder, e.g. {OUTPUT_ALIAS}=runs (read as {OUTPUT_KEY}=runs)")
            out.append(f"{OUTPUT_KEY}={value}")
        elif override is not None:
            out.append(f"{OUTPUT_KEY}={override.group(1)}")
        else:
            out.append(arg)
    return out


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def prepare_command_line(argv: Sequence[str], config_name: str = "train.yaml") -> list[str]:
    """The command line ``train.py`` / ``eval.py`` hand to Hydra: ``--help`` answered here (exit 0),
    the output alias translated, every override checked (exit 1 with one line)."""
    if wants_help(argv):
        from arlopti.entry.help import script_help

        print(script_help(config_name))
        sys.exit(0)
    from arlopti.config import ConfigError
    from arlopti.config.cli_report import one_line

    try:
        argv = translate_output_dir(argv)
    except ConfigError as err:
        sys.exit(one_line(err))
    check_command_line(argv, config_name)
    return argv


def check_command_line(argv: list[str], config_name: str = "train.yaml") -> None:
    """Refuse an override of the wrong type before Hydra composes (OmegaConf would turn
    ``algorithm.lopti.enabled=no`` into ``False``), or of a key no config has: exit 1 with one line
    naming the key and the fix."""
    from arlopti.config import ConfigError, check_overrides
    from arlopti.config.cli_report import one_line

    overrides = command_line_overrides(argv)
    try:
        check_overrides(overrides)
        if _composes_here(argv) and not _schema_leaves_only(overrides):
            check_composes(overrides, config_name)
    except ConfigError as err:
        sys.exit(one_line(err))


def _schema_leaves_only(overrides: Sequence[str]) -> bool:
    """Whether every override sets a schema setting (``optim.lr=...``): :func:`~arlopti.config.check_overrides`
    has checked those fully, and composing (0.2 s) would add nothing. A group choice or any other key composes."""
    import dataclasses

    from arlopti.config import field_default, field_types

    leaves = {key for key, f, _ in field_types() if not dataclasses.is_dataclass(field_default(f))}
    return all(line.lstrip("+").split("=", 1)[0] in leaves for line in overrides)


def _composes_here(argv: Sequence[str]) -> bool:
    """Whether the config the command line names is the checkout's (another ``--config-dir`` /
    ``--config-path`` / ``--config-name`` is Hydra's to check)."""
    return not any(a.split("=")[0] in ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
                   for a in argv)


def _first_choices(overrides: Sequence[str]) -> list[str]:
    """The overrides with a ``--multirun`` sweep (``a=1,2``, ``range(..)``) reduced to its first value:
    what one job composes (every job has the same keys)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except Exception:  # noqa: BLE001 - a syntax error: Hydra names it itself
            return []
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()), None)
            if first is None:
                continue
            line = f"{override.get_key_element()}={first}"
        out.append(line)
    return out


def check_composes(overrides: Sequence[str], config_name: str = "train.yaml") -> None:
    """Compose ``config_name`` with ``overrides`` as Hydra is about to; a key no config has, or a group
    option with no file, is a :class:`~arlopti.config.ConfigError` of one line with the fix
    (:mod:`arlopti.entry.unknown_keys`), and so is a reward model given as a reward function
    (:func:`check_reward_entries`). Other composition errors are left to Hydra's report."""
    if not overrides:
        return
    from hydra.errors import ConfigCompositionException

    from arlopti.config.compose import compose
    from arlopti.entry.unknown_keys import composition_error

    lines = _first_choices(overrides)
    try:
        cfg = compose(lines, config_name=config_name)
    except ConfigCompositionException as err:
        error = composition_error(err, lines, config_name, shown=overrides)
        if error is not None:
            raise error from None
        return
    check_reward_entries(cfg.get("task"))


def looks_like_a_model(entry: str) -> bool:
    """A reward entry that names a model rather than a function: no ``:function`` part, and a folder
    holding a ``config.json`` or a hub name (``owner/name``)."""
    if ":" in entry or entry.endswith(".py"):
        return False
    folder = Path(entry).expanduser()
    return (folder / "config.json").is_file() or (not folder.exists() and entry.count("/") == 1)


def check_reward_entries(task) -> None:
    """TRL's habit of passing a reward model's folder in ``reward_funcs``: ``task.reward_fn(s)`` naming a
    model is refused in one line that names ``task.reward_model``, the key a learned reward model goes in."""
    from arlopti.config import ConfigError

    if task is None:
        return
    for key in ("reward_fn", "reward_fns"):
        value = task.get(key)
        entries = [value] if isinstance(value, str) else list(value or [])
        models = [str(e) for e in entries if isinstance(e, str) and looks_like_a_model(e)]
        if models:
            raise ConfigError(f"task.{key}: {models[0]} is a model, not a function (module:fn or file.py:fn); a learned "
                              f"reward model goes in task.reward_model={models[0]} (several: task.reward_model=[a,b]), "
                              "their weights the last of task.reward_weights (docs/custom_task.md)")


__all__ = ["OUTPUT_ALIAS", "OUTPUT_KEY", "check_command_line", "check_composes", "command_line_overrides",
           "prepare_command_line", "translate_output_dir"]
