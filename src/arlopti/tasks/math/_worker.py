"""Entry point of one grader worker process. Run by path, never imported by the trainer.

``python _worker.py READ_FD WRITE_FD MEMORY_LIMIT_MB MODULES`` - started by
:class:`arlopti.tasks.math.pool.WorkerPool` in a fresh interpreter. Being run by file path
(not ``-m``) keeps the worker free of the parent's ``__main__`` module and of the ``arlopti``
package imports: it loads only the grader modules named in ``MODULES`` from this folder,
before it reports ready: ``symbolic`` (``symbolic.py``: math-verify, sympy; function
``symbolic_match``) and/or ``official`` (``official_sympy.py``: sympy, pylatexenc; function
``official_sympy_match``), comma-separated; ``0`` loads none (only the ``test.*`` hooks) and
``1`` means ``symbolic`` (the old boolean form).

An optional fifth argument, JSON ``{"functions": {name: spec}, "sys_path": [...], "batch": bool}``,
names user functions (``task=custom``'s reward, :mod:`arlopti.tasks.custom`; ``batch``: they return
lists, as a TRL-convention function always does, called through ``user_code.trl_call``): ``sys_path`` entries go first
on ``sys.path``, then each spec is loaded with ``load_function`` of ``tasks/user_code.py`` (loaded
by path, like the grader modules). A spec that fails to load makes the worker send
``("load_error", text)`` and exit instead of reporting ready. A user function's reply is
``("ok", task_id, plain(value))`` and its error reply carries the formatted traceback (last
4,000 characters), not just the exception type.

Protocol over two pipes (``multiprocessing.connection`` framing, pickled tuples): the worker
sends ``("ready", pid)`` once its imports are done, then answers each
``(task_id, function_name, args)`` with ``("ok", task_id, value)`` or
``("error", task_id, exception_type_name)``; ``None`` or EOF makes it exit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _test_sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _test_bigint(exponent: int) -> int:
    # One C call that holds the GIL: signal handlers cannot interrupt it, only a kill can.
    return pow(7, exponent).bit_length()


def _test_exit(code: int) -> None:
    os._exit(code)


def _test_echo(value):
    return value


# module key -> (file next to this one, function name exported to the pool)
_MODULES = {
    "symbolic": ("symbolic.py", "symbolic_match"),
    "official": ("official_sympy.py", "official_sympy_match"),
}


def _load(key: str):
    filename, function = _MODULES[key]
    spec = importlib.util.spec_from_file_location(f"arlopti_math_{key}_worker", _HERE / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return function, getattr(module, function)


def _load_by_path(name: str, path: Path):
    """A standard-library-only module of this package, loaded by path (no ``arlopti`` package import in
    the worker: it would bring torch under the worker's address-space cap)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_user_code():
    """``tasks/user_code.py`` (:func:`_load_by_path`)."""
    return _load_by_path("arlopti_user_code_worker", _HERE.parent / "user_code.py")


def _user_call(user_code, function, batch: bool):
    """``function`` with its return value made plain (``user_code.plain``) for the pipe."""
    def call(*args):
        return user_code.plain(function(*args), batch=batch)

    return call


def _user_traceback(err: BaseException) -> str:
    """The traceback of an error in user code, from the user's frame on (this file's two frames,
    ``main`` and the ``_user_call`` wrapper, left out)."""
    tb = err.__traceback__
    for _ in range(2):
        if tb is not None and tb.tb_next is not None and Path(tb.tb_frame.f_code.co_filename) == Path(__file__):
            tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))


def _module_keys(arg: str | None) -> list[str]:
    if arg is None or arg == "1":
        return ["symbolic"]
    if arg in ("0", ""):
        return []
    return [k for k in arg.split(",") if k]


def _set_parent_death_signal() -> None:
    """SIGKILL this worker if the parent dies (Linux; best effort), so no orphan keeps running."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    read_fd, write_fd, memory_limit_mb = int(argv[0]), int(argv[1]), int(argv[2])
    modules = _module_keys(argv[3] if len(argv) >= 4 else None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    _set_parent_death_signal()
    if memory_limit_mb > 0:
        try:
            import resource

            limit = memory_limit_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    functions = {
        "test.sleep": _test_sleep,
        "test.bigint": _test_bigint,
        "test.exit": _test_exit,
        "test.echo": _test_echo,
    }
    # A function whose module is not loaded (pool tests load none) is unknown -> KeyError reply.
    for key in modules:
        name, function = _load(key)
        functions[name] = function
    user = json.loads(argv[4]) if len(argv) >= 5 and argv[4] else {}
    user_names = _load_user_functions(user, functions, outbox)
    if user_names is None:
        return 3
    outbox.send(("ready", os.getpid()))
    return _serve(inbox, outbox, functions, user_names)


def _load_user_functions(user: dict, functions: dict, outbox: Connection) -> set[str] | None:
    """Add ``user["functions"]`` (name -> spec) to ``functions``; their names, or None after sending the
    load error to the trainer."""
    if not user.get("functions"):
        return set()
    for entry in reversed(user.get("sys_path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    user_code = _load_user_code()
    try:
        for name, spec in user["functions"].items():
            function = user_code.load_function(spec)
            trl = user_code.trl_convention(function)  # TRL's (prompts, completions, **columns): lists
            functions[name] = _user_call(user_code, user_code.trl_call(function) if trl else function,
                                         trl or bool(user.get("batch")))
    except BaseException as err:  # noqa: BLE001 - the load error goes to the trainer, then exit
        outbox.send(("load_error", str(err) if isinstance(err, user_code.UserCodeError)
                     else traceback.format_exc()[-4000:]))
        return None
    return set(user["functions"])


def _serve(inbox: Connection, outbox: Connection, functions: dict, user_names: set[str]) -> int:
    """Run the calls the trainer sends until it closes the pipe; replies are plain values (the trainer
    reads nothing else: :func:`arlopti.tasks.env.calls.plain_loads`)."""
    plain_value = _load_by_path("arlopti_env_calls_worker", _HERE.parent / "env" / "calls.py").plain_value
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):
            return 0
        if msg is None:
            return 0
        task_id, name, args = msg
        try:
            reply = ("ok", task_id, plain_value(functions[name](*args)))
        except BaseException as err:  # noqa: BLE001  (MemoryError, RecursionError, anything)
            # Only the type name: str() of some sympy errors is itself slow. User code: the traceback.
            reply = ("error", task_id, _user_traceback(err)[-4000:] if name in user_names
                     else type(err).__name__)
        try:
            outbox.send(reply)
        except (OSError, ValueError, TypeError):
            return 0


if __name__ == "__main__":
    # Running by path puts this folder first on sys.path; its module names (pool, grader, ...)
    # must not shadow anything sympy imports.
    if sys.path and Path(sys.path[0]).resolve() == _HERE:
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
