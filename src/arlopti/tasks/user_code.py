"""Loading a user's reward function from ``module.path:function`` or ``path/to/file.py:function``.

Standard library only, no ``arlopti`` import: the grader worker (``tasks/math/_worker.py``) loads
this file by path, so the trainer and the worker resolve a spec with the same code.

Resolution rules (:func:`load_function`):

* ``pkg.mod:fn`` (an import path): the current directory goes first on ``sys.path`` (as with
  ``python -m``), then ``importlib.import_module("pkg.mod")``;
* ``path/to/file.py:fn`` (a spec whose module part ends in ``.py`` or holds a ``/``): the file,
  relative to the current directory, is executed as a module of its own and its folder goes first on
  ``sys.path`` (so it can import its neighbours, as a script can);
* ``fn`` must be a callable attribute of the module.

Every failure raises :class:`UserCodeError` whose message names the spec and the cause (for an
import error, the exception type and message; a ``SyntaxError`` names ``file:line``).

:func:`plain` turns what the function returned into picklable plain values for the pipe back to
the trainer: a real number -> ``float``, a bool stays a bool (a scalar with ``.item()``, such as
``numpy.bool_`` or a one-element tensor, counts as its item), a mapping -> a dict of those, a
list/tuple (batch functions) -> a list of those; anything else becomes the marker
``(BAD_TYPE, type name, short repr)`` so that the trainer can name the type.

TRL's convention (:func:`trl_convention`): a function whose first two parameters are named ``prompts`` and
``completions`` is TRL's ``reward_func(prompts, completions, **columns) -> list[float | None]``; the worker
calls it with lists through :func:`trl_call` (positional arguments over the pipe, keywords to the function).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import numbers
import os
import sys
from pathlib import Path
from typing import Any, Callable

BAD_TYPE = "__arlopti_bad_type__"


class UserCodeError(ImportError):
    """A reward spec that cannot be loaded; the message names the spec and why."""


def parse_spec(spec: str) -> tuple[str, str, bool]:
    """``(module part, function name, is_file)`` of ``spec`` (see the module docstring)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise UserCodeError(f"{spec!r}: expected 'module.path:function' or 'path/to/file.py:function'")
    module, _, name = spec.rpartition(":")
    module, name = module.strip(), name.strip()
    if not module or not name.isidentifier():
        raise UserCodeError(f"{spec!r}: expected 'module.path:function' or 'path/to/file.py:function' "
                            f"({name!r} is not a function name)")
    is_file = module.endswith(".py") or "/" in module or os.sep in module
    return module, name, is_file


def _describe(err: BaseException) -> str:
    if isinstance(err, SyntaxError):
        return f"SyntaxError: {err.msg} ({err.filename}:{err.lineno})"
    return f"{type(err).__name__}: {err}"


def _prepend(path: str) -> None:
    if path not in sys.path:
        sys.path.insert(0, path)


def resolve_spec(spec: str, cwd: str | None = None) -> str:
    """``spec`` with a file path made absolute against ``cwd`` (default: the current directory),
    so a worker process resolves it to the same file."""
    module, name, is_file = parse_spec(spec)
    if not is_file:
        return f"{module}:{name}"
    return f"{Path(cwd or os.getcwd(), module).resolve()}:{name}"


def load_module(module_part: str, is_file: bool, spec: str, cwd: str | None = None):
    """The module ``module_part`` names (an import path, or a file relative to ``cwd``; the module
    docstring's rules); raises :class:`UserCodeError` naming ``spec`` and the cause."""
    cwd = cwd or os.getcwd()
    if not is_file:
        _prepend(cwd)
        try:
            return importlib.import_module(module_part)
        except BaseException as err:  # noqa: BLE001
            raise UserCodeError(f"{spec!r}: cannot import {module_part} ({_describe(err)}; the current "
                                f"directory {cwd} and PYTHONPATH are searched)") from err
    path = Path(cwd, module_part).resolve()
    if not path.is_file():
        raise UserCodeError(f"{spec!r}: file {path} does not exist")
    mod_name = f"arlopti_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module = sys.modules.get(mod_name)
    if module is None:
        _prepend(str(path.parent))
        try:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
        except BaseException as err:  # noqa: BLE001 - user code may raise anything while importing
            sys.modules.pop(mod_name, None)
            raise UserCodeError(f"{spec!r}: importing {path} failed ({_describe(err)})") from err
    return module


def load_function(spec: str, cwd: str | None = None) -> Callable[..., Any]:
    """The callable ``spec`` names; raises :class:`UserCodeError` naming the spec and the cause."""
    module_part, name, is_file = parse_spec(spec)
    module = load_module(module_part, is_file, spec, cwd)
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise UserCodeError(f"{spec!r}: {module_part} has no attribute {name!r} (its functions: {defined})")
    function = getattr(module, name)
    if not callable(function):
        raise UserCodeError(f"{spec!r}: {module_part}.{name} is a {type(function).__name__}, not a function")
    return function


def _scalar(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy.bool_, a 0-d array, a one-element torch tensor
    if callable(item) and not isinstance(value, (str, bytes, dict)):
        try:
            v = item()
        except Exception:  # noqa: BLE001 - not a scalar
            v = None
        if isinstance(v, (bool, numbers.Real)):
            return v if isinstance(v, bool) else float(v)
    return (BAD_TYPE, type(value).__name__, repr(value)[:80])


def plain(value: Any, batch: bool = False) -> Any:
    """Picklable plain form of a reward function's return value (see the module docstring)."""
    if batch:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return (BAD_TYPE, type(value).__name__, repr(value)[:80])
    if isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        try:
            return {str(k): _scalar(value[k]) for k in value.keys()}
        except Exception:  # noqa: BLE001 - an odd mapping
            return (BAD_TYPE, type(value).__name__, "")
    return _scalar(value)


def trl_convention(function: Callable[..., Any]) -> bool:
    """Whether ``function`` follows TRL's reward-function convention: its first two parameters are named
    ``prompts`` and ``completions`` (``f(prompts, completions, **columns) -> list[float | None]``)."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: not TRL's
        return False
    return [p.name for p in params[:2]] == ["prompts", "completions"]


def trl_call(function: Callable[..., Any]) -> Callable[[list, list, dict], Any]:
    """``call(prompts, completions, columns)`` = ``function(prompts=prompts, completions=completions, **columns)``:
    a TRL-convention function called with positional arguments (what the worker pool sends)."""
    def call(prompts: list, completions: list, columns: dict) -> Any:
        return function(prompts=prompts, completions=completions, **columns)

    return call
