"""The generic checker of the schema (:mod:`arlopti.config.schema`): building a dataclass from a
mapping, and every field's type, ``choices`` and ``range``, read from the field itself.

Types are checked from the field annotations, in two places, both generic (:func:`check_value`):
:func:`check_overrides` checks each command-line ``key=value`` literal before Hydra composes
(``train.py``), so that ``algorithm.lopti.enabled=no`` is an error rather than OmegaConf's ``False``;
:func:`check_fields` checks the composed values (no ``inf``/``nan`` float unless the range allows it,
tuple lengths, bools and ints). In YAML files, ``yes``/``no``/``on``/``off`` are YAML 1.1 booleans
(the loader turns them into ``true``/``false`` before anything sees them); configs/ uses only
``true``/``false`` (a test checks). Nothing here knows a particular key: the cross-field rules are
in :mod:`arlopti.config.rules`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from arlopti.config.schema import RETIRED_KEYS, ConfigError, RunConfig, field_default, config_key

def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def from_dict(cls, data: Mapping[str, Any] | None, where: str):
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses.

    Unknown keys raise :class:`ConfigError` naming ``where.key`` and the known keys (a retired
    key: why it went and what replaces it).
    """
    data = dict(data or {})
    fields = dataclasses.fields(cls)
    # a field with a key alias (rollout.async -> async_) is read under either name
    data = {next((f.name for f in fields if config_key(f) == k), k): v for k, v in data.items()}
    known = {f.name: f for f in fields}
    for name in sorted(set(data) - set(known)):
        if _key(where, name) in RETIRED_KEYS:
            raise ConfigError(RETIRED_KEYS[_key(where, name)])
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where or 'run'}: unknown key(s) {unknown}; known keys: "
                          f"{sorted(config_key(f) for f in fields)}")
    kwargs = {}
    for name, value in data.items():
        default = field_default(known[name])
        if dataclasses.is_dataclass(default) and not isinstance(value, type(default)):
            value = from_dict(type(default), value, _key(where, config_key(known[name])))
        elif isinstance(default, tuple) and value is not None:
            value = tuple(value)
        elif isinstance(default, list) and value is not None:
            value = list(value)
        kwargs[name] = value
    return cls(**kwargs)


def saved_run_as_current(saved: Mapping[str, Any], cls: type = RunConfig, where: str = "") -> dict:
    """A run config saved by an older version (``hyper_parameters.run``), in today's shape: retired
    keys dropped, keys added since filled with their default (which by convention reproduces the
    old behaviour). Keys this version does not know otherwise stay, so that they show as differences."""
    out = {k: v for k, v in saved.items() if _key(where, k) not in RETIRED_KEYS}
    for f in dataclasses.fields(cls):
        default = field_default(f)
        if f.name not in out:
            out[f.name] = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        elif dataclasses.is_dataclass(default) and isinstance(out[f.name], Mapping):
            out[f.name] = saved_run_as_current(out[f.name], type(default), _key(where, f.name))
    return out


def walk_fields(cls: type, where: str = "") -> Iterator[tuple[str, dataclasses.Field, type]]:
    """``(dotted key, field, owning class)`` of every field, depth first (nested dataclasses too)."""
    for f in dataclasses.fields(cls):
        yield _key(where, config_key(f)), f, cls
        default = field_default(f)
        if dataclasses.is_dataclass(default):
            yield from walk_fields(type(default), _key(where, config_key(f)))


def field_choices(f: dataclasses.Field) -> dict | None:
    """A field's allowed values as ``{value: note}`` (note "" when none), or None."""
    choices = f.metadata.get("choices")
    if callable(choices):
        choices = choices()
    if choices is None:
        return None
    return dict(choices) if isinstance(choices, Mapping) else {c: "" for c in choices}


def _nullable(f: dataclasses.Field) -> bool:
    return "None" in str(f.type)


def _interval(text: str) -> tuple[float, float, bool, bool]:
    lo, hi = (s.strip() for s in text[1:-1].split(","))
    return float(lo), float(hi), text[0] == "[", text[-1] == "]"


def _alternatives(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]


def _member(value: Any, choices: dict) -> bool:
    try:
        return value in choices
    except TypeError:  # unhashable
        return False


def _check_field(key: str, f: dataclasses.Field, value: Any, hint: Any = None) -> None:
    if hint is not None:
        check_value(key, value, hint, f)
    if value is None and _nullable(f):
        return
    choices = field_choices(f)
    if choices is not None and not _member(value, choices):
        # a note "ours: ..." / "official: ..." shows its tag: 'skip' (ours) or 'step' (official)
        alts = _alternatives([f"{c!r}" + (f" ({note.split(':')[0]})" if ":" in note else "")
                              for c, note in choices.items()])
        own = "; a method of your own: name the module that registers it, plugins=[my_module] (docs/plugins.md)" \
            if getattr(f.metadata.get("choices"), "registry", None) else ""
        raise ConfigError(f"{key}={value!r}: use {alts}" + (", or null" if _nullable(f) else "") + own)
    if "range" in f.metadata:
        lo, hi, lo_closed, hi_closed = _interval(f.metadata["range"])
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (value >= lo if lo_closed else value > lo) and (value <= hi if hi_closed else value < hi))
        if not ok:
            if math.isinf(hi):
                bound = f"must be {'>=' if lo_closed else '>'} {lo:g}"
            else:
                bound = f"must lie in {f.metadata['range']}"
            raise ConfigError(f"{key}={value!r} {bound}" + (" or null" if _nullable(f) else ""))


def check_setting(cls: type, name: str, value: Any, where: str) -> None:
    """Check one value against the field ``name`` of schema dataclass ``cls`` (type, choices, range),
    as :func:`check_fields` would at key ``where.name``: for code outside the config that takes a
    setting's value as an argument and guards it with the schema's own rule, not a copy."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    _check_field(_key(where, name), f, value, typing.get_type_hints(cls)[name])


def check_fields(cfg: Any, where: str = "") -> None:
    """The type (:func:`check_value`), ``choices`` and ``range`` of every field of dataclass ``cfg``
    (recursively)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, _key(where, config_key(f)))
        else:
            _check_field(_key(where, config_key(f)), f, value, hints.get(f.name))


# --------------------------------------------------------------------------------------------
# Types, from the annotations
# --------------------------------------------------------------------------------------------

def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None`` / ``Optional[T]``, else ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(hint)):
            return args[0], True
    return hint, False


def _inf_allowed(f: dataclasses.Field | None) -> tuple[bool, bool]:
    """Whether ``-inf`` / ``+inf`` are allowed: only by a ``range`` closed at that infinite end."""
    text = f.metadata.get("range") if f is not None else None
    if not text:
        return False, False
    lo, hi, lo_closed, hi_closed = _interval(text)
    return lo_closed and lo == -math.inf, hi_closed and hi == math.inf


def _show(value: Any) -> str:
    """A value as it would be written on the command line / in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # inf, nan, 0.5
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def expected_type(hint: Any, f: dataclasses.Field | None = None) -> str | None:
    """What a field of type ``hint`` accepts, in words (None: a type not checked here, such as str)."""
    base, nullable = unwrap_optional(hint)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if base is bool:
        text = "a bool (true or false)"
    elif base is int:
        text = "an int"
    elif base is float:
        lo, hi = _inf_allowed(f)
        if lo and hi:
            text = "a float (not nan)"
        else:
            text = "a finite float" + (" or inf" if hi else " or -inf" if lo else "")
    elif origin is tuple and args and args[-1] is not Ellipsis and all(a in (bool, int, float) for a in args):
        names = {a.__name__ for a in args}
        what = f"{names.pop()}s" if len(names) == 1 else "values " + ", ".join(a.__name__ for a in args)
        text = f"a list of exactly {len(args)} {what}"
    else:
        return None
    return text + (", or null" if nullable else "")


def check_value(key: str, value: Any, hint: Any, f: dataclasses.Field | None = None) -> None:
    """Raise :class:`ConfigError` ``"<key>=<value>: expected <type>"`` unless ``value`` fits the field
    type ``hint``: ``bool`` (a real bool, not ``"no"``, ``1``), ``int`` (not a bool, not ``4.5``),
    ``float`` (a number, not a bool; finite unless the field's ``range`` is closed at an infinite end;
    never ``nan``), ``tuple[float, float]`` (exactly that many, each checked), each optionally
    ``| None``. Other types (str, lists of str, dataclasses) are left to Hydra and the choices."""
    base, nullable = unwrap_optional(hint)
    expected = expected_type(hint, f)
    if expected is None:
        return

    def fail() -> typing.NoReturn:
        raise ConfigError(f"{key}={_show(value)}: expected {expected}")

    if value is None:
        if not nullable:
            fail()
        return
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            fail()
        for i, (item, item_type) in enumerate(zip(value, args)):
            try:
                check_value(f"{key}[{i}]", item, item_type, f)
            except ConfigError:
                fail()
        return
    if isinstance(value, bool) != (base is bool):
        fail()
    if base is int and not isinstance(value, numbers.Integral):
        fail()
    if base is float:
        if not isinstance(value, numbers.Real):
            fail()
        lo, hi = _inf_allowed(f)
        if math.isnan(value) or (value == math.inf and not hi) or (value == -math.inf and not lo):
            fail()


def field_types(cls: type = RunConfig, where: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dotted key, field, type hint)`` of every field of ``cls``, nested dataclasses included
    (their own key first, then their fields)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield _key(where, config_key(f)), f, hints[f.name]
        default = field_default(f)
        if dataclasses.is_dataclass(default):
            yield from field_types(type(default), _key(where, config_key(f)))


def _interpolated(value: Any) -> bool:
    """Whether a parsed override value holds an interpolation (``${...}``), in a list too."""
    if isinstance(value, (list, tuple)):
        return any(_interpolated(v) for v in value)
    return isinstance(value, str) and "${" in value


def close_match(key: str, known: Sequence[str]) -> str | None:
    """The known key closest to a misspelt one (``difflib``, as Python's own "did you mean"), or None."""
    found = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_key_message(line: str, key: str, known: Sequence[str]) -> str:
    """One line for an override ``line`` whose ``key`` no config has: the closest known key (among its
    siblings when its parent exists, so a shared prefix does not count as likeness), else the keys of its
    parent node, else where the keys are listed. Never Hydra's ``+key`` advice: a key added that way
    is read by nothing."""
    parent, _, leaf = key.rpartition(".")
    siblings = sorted({k[len(parent) + 1:].split(".")[0] for k in known if parent and k.startswith(parent + ".")})
    if siblings:
        match = close_match(leaf, siblings)
        match = f"{parent}.{match}" if match is not None else None
    else:
        match = close_match(key, known)
    if match is not None:
        return f"{line}: no such key; did you mean `{match}`?"
    if siblings:
        return f"{line}: no such key; `{parent}` has: {', '.join(siblings)}"
    return f"{line}: no such key (`arlopti train --help` lists the groups, docs/config.md every key)"


def _schema_prefixes(cls: type) -> tuple[set[str], set[str]]:
    """(the groups of ``cls`` that are dataclasses, the keys whose values are free-form: any sub-key goes)."""
    groups, free = set(), set()
    for key, f, hint in field_types(cls):
        if dataclasses.is_dataclass(field_default(f)):
            groups.add(key)
        elif typing.get_origin(unwrap_optional(hint)[0]) is dict or unwrap_optional(hint)[0] in (dict, Any):
            free.add(key)
    return groups, free


def _parsed(overrides: Sequence[str]):
    """``(line, Hydra's parsed override)`` of each override line; a line Hydra cannot parse is passed over
    (Hydra names its syntax error itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except Exception:  # noqa: BLE001 - a syntax error: Hydra names it itself
            continue
        yield line, override


def check_known_keys(overrides: Sequence[str], cls: type = RunConfig) -> None:
    """Refuse a ``key=value`` override under one of the schema's groups (``algorithm.*``, ``optim.*``,
    ...) that names no field: one line with the closest field (:func:`unknown_key_message`), before
    Hydra composes. Added keys (``+key``), deletions and keys outside the schema's groups pass (the
    command line checks those against the composed config, :mod:`arlopti.entry.cli`)."""
    groups, free = _schema_prefixes(cls)
    known = [key for key, _, _ in field_types(cls)]
    leaves = [key for key in known if key not in groups]
    for line, override in _parsed(overrides):
        key = override.key_or_group
        if override.is_delete() or override.is_add() or override.is_force_add() or override.package is not None:
            continue
        parents = [key.rsplit(".", n)[0] for n in range(1, key.count(".") + 1)]
        if key in known or not any(p in groups for p in parents) or any(p in free for p in parents):
            continue
        raise ConfigError(unknown_key_message(line, key, leaves))


def check_overrides(overrides: Sequence[str], cls: type = RunConfig) -> None:
    """Check Hydra command-line overrides (``key=value``, ``+key=value``, ``++key=value``) against
    the types of the fields they set, before OmegaConf converts them: ``algorithm.lopti.enabled=no``
    would otherwise arrive as ``False``, ``optim.lr=inf`` as ``inf``. Raises :class:`ConfigError`
    naming the key, the value and the expected type (:func:`check_value`).

    Only keys of ``cls`` (the run config's groups) are checked; group choices (``algorithm=lopti``),
    deletions, interpolations (``${...}``) and other keys (``trainer.*``, ``data.*``, ``hydra.*``)
    pass, as do overrides Hydra's parser cannot read (Hydra reports those itself). In a
    ``--multirun`` choice sweep (``key=a,b``) every choice is checked. First, a key under one of these
    groups that names no field is refused with the closest one (:func:`check_known_keys`)."""
    from hydra.core.override_parser.types import ChoiceSweep

    check_known_keys(overrides, cls)
    fields_by_key = {key: (f, hint) for key, f, hint in field_types(cls)}
    for line, override in _parsed(overrides):
        if override.is_delete() or override.package is not None:
            continue
        entry = fields_by_key.get(override.key_or_group)
        if entry is None:
            continue
        f, hint = entry
        value = override.value()
        if override.is_sweep_override():
            if not isinstance(value, ChoiceSweep):
                continue  # range / interval / glob sweeps: numbers by construction
            values = list(value.list)
        else:
            values = [value]
        for v in values:
            if _interpolated(v):
                continue  # checked after composition (validate_run)
            if expected_type(hint, f) is None:
                continue
            try:
                check_value(override.key_or_group, v, hint, f)
            except ConfigError:
                text = line.split("=", 1)[1] if not override.is_sweep_override() else _show(v)
                raise ConfigError(f"{override.key_or_group}={text}: expected {expected_type(hint, f)} "
                                  "(command-line override)") from None
