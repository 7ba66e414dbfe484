"""The units of ``arlopti.tasks`` import each other without a circle.

A unit is the first component under ``arlopti.tasks``: a sub-package (``math``, ``env``, ``kk``) or a
top-level module (``base``, ``custom``, ``in_process``, ...). Every ``import``/``from ... import`` of an
``arlopti.tasks`` module counts, also the lazy ones inside functions and relative ones. The package's
own ``__init__`` (which imports the built-in tasks so that they register) is not a unit: ``base``'s
registry reaches it lazily on purpose, and it sits above every unit.
"""

from __future__ import annotations

import ast
from pathlib import Path

TASKS = Path(__file__).resolve().parents[2] / "src" / "arlopti" / "tasks"
PACKAGE = "arlopti.tasks"
ROOT = "(tasks)"  # the package's __init__


def units(root: Path = TASKS) -> set[str]:
    return ({p.stem for p in root.glob("*.py") if p.stem != "__init__"}
            | {p.name for p in root.iterdir() if (p / "__init__.py").is_file()})


def module_of(path: Path, root: Path = TASKS) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def unit_of(module: str, known: set[str]) -> str | None:
    """The unit ``module`` lies in, ROOT for the package itself, None outside ``arlopti.tasks``."""
    if module == PACKAGE:
        return ROOT
    if not module.startswith(PACKAGE + "."):
        return None
    first = module[len(PACKAGE) + 1:].split(".", 1)[0]
    return first if first in known else ROOT


def imported_modules(path: Path, root: Path = TASKS) -> list[tuple[str, int]]:
    """(absolute module name, line) for every import in ``path``, ``from X import y`` giving ``X.y``
    too (``y`` may be a submodule: ``from arlopti.tasks import kk``)."""
    me = module_of(path, root)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out.append((module, node.lineno))
            out += [(f"{module}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
    return out


def unit_graph(root: Path = TASKS) -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: ["file:line", ...]}; self-imports and the package root left out."""
    known = units(root)
    graph: dict[str, dict[str, list[str]]] = {u: {} for u in known}
    for path in sorted(root.rglob("*.py")):
        mine = unit_of(module_of(path, root), known)
        if mine == ROOT:
            continue
        for module, line in imported_modules(path, root):
            theirs = unit_of(module, known)
            if theirs is None or theirs in (ROOT, mine):
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            sites = graph[mine].setdefault(theirs, [])
            if where not in sites:
                sites.append(where)
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One circle of units (first unit repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for nxt in sorted(graph.get(unit, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in state and (found := visit(unit)):
            return found
    return None


def describe(cycle: list[str], graph) -> str:
    return "; ".join(f"{a} -> {b} ({', '.join(graph[a][b])})" for a, b in zip(cycle, cycle[1:]))


def test_the_units_of_tasks_import_each_other_without_a_circle():
    graph = unit_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "arlopti.tasks units import each other in a circle: " + describe(cycle, graph)


def test_the_graph_sees_lazy_relative_and_from_package_imports(tmp_path):
    """The check can fail: a lazy import closing math -> env -> in_process -> math is found."""
    pkg = tmp_path / "tasks"
    for folder in ("math", "env"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from arlopti.tasks import math\n")
    (pkg / "outcome.py").write_text("")
    (pkg / "math" / "pool.py").write_text("from ..env.calls import plain_loads\n"
                                          "from arlopti.tasks import outcome\n")
    (pkg / "env" / "calls.py").write_text("def f():\n    from arlopti.tasks import in_process\n")
    (pkg / "in_process.py").write_text("def run():\n    from arlopti.tasks.outcome import TaskOutcome\n")
    graph = unit_graph(pkg)
    assert graph == {"math": {"env": ["tasks/math/pool.py:1"], "outcome": ["tasks/math/pool.py:2"]},
                     "env": {"in_process": ["tasks/env/calls.py:2"]},
                     "in_process": {"outcome": ["tasks/in_process.py:2"]}, "outcome": {}}
    assert find_cycle(graph) is None

    (pkg / "in_process.py").write_text("def run():\n    from arlopti.tasks.math.pool import TaskOutcome\n")
    cycle = find_cycle(unit_graph(pkg))
    assert cycle is not None and set(cycle) == {"math", "env", "in_process"}
