"""The import rule of docs/architecture.md: no module imports from a layer above its own.

The layers and the allowed exceptions are read from the doc's two tables, so the doc and the
rule cannot drift apart. Every ``import``/``from ... import`` of an ``arlopti`` module counts, also
the lazy ones inside functions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "arlopti"
DOC = REPO / "docs" / "architecture.md"


def doc_tables() -> tuple[dict[str, int], set[tuple[str, str]]]:
    """(module prefix -> layer number, {(from prefix, to prefix)} allowed upward) from the doc."""
    text = DOC.read_text()
    layers: dict[str, int] = {}
    for m in re.finditer(r"^\| (\d+) \w+ \| (.+?) \| .* \|$", text, re.M):
        for name in re.findall(r"`([\w.]+)`", m.group(2)):
            layers[name] = int(m.group(1))
    allowed_part = text.split("## The allowed upward imports", 1)[1]
    allowed = {(a, b) for a, b in re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|", allowed_part, re.M)}
    return layers, allowed


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
    return ".".join(parts) or "__init__"


def arlopti_imports(path: Path) -> list[tuple[str, int]]:
    """(imported module under arlopti, line) for every import of an arlopti module in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "arlopti":
                out.append(("__init__", node.lineno))
            elif name.startswith("arlopti."):
                out.append((name[len("arlopti."):], node.lineno))
    return out


def owner(module: str, prefixes) -> str | None:
    """The longest prefix of ``prefixes`` that ``module`` is or lies under."""
    hits = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(hits, key=len) if hits else None


def upward_imports() -> tuple[list[str], list[str], set[tuple[str, str]]]:
    layers, allowed = doc_tables()
    unplaced, upward, used = [], [], set()
    for path in sorted(SRC.rglob("*.py")):
        me = module_name(path)
        mine = owner(me, layers)
        if mine is None:
            unplaced.append(me)
            continue
        for target, line in arlopti_imports(path):
            theirs = owner(target, layers)
            if theirs is None or layers[theirs] <= layers[mine]:
                continue
            exception = next(((a, b) for a, b in allowed if owner(me, [a]) and owner(target, [b])), None)
            if exception:
                used.add(exception)
            else:
                upward.append(f"{path.relative_to(REPO)}:{line}: {me} (layer {layers[mine]}) imports "
                              f"{target} (layer {layers[theirs]})")
    return unplaced, upward, used


def unit_of(module: str) -> str:
    """The unit a module belongs to: its top-level folder or file under arlopti (``__init__`` for the package)."""
    return module.split(".", 1)[0]


def units() -> set[str]:
    return {p.name if p.is_dir() else p.stem for p in SRC.iterdir()
            if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"}


def test_the_doc_names_layers_and_exceptions():
    layers, allowed = doc_tables()
    assert {"config", "algorithms", "plugins", "learner", "rollout", "callbacks"} <= set(layers)
    assert len(allowed) <= 2, "the issue's goal: at most 2 upward imports, each with a reason"


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """unit -> its floor: 1 + the highest floor of the units it imports (1 for a unit importing none)."""
    out: dict[str, int] = {}

    def floor(u: str, trail: frozenset) -> int:
        if u not in out:
            out[u] = 1 + max((floor(v, trail | {u}) for v in graph[u] if v not in trail | {u}), default=0)
        return out[u]

    for u in graph:
        floor(u, frozenset())
    return out


def test_the_doc_gives_each_unit_the_floor_its_imports_give_it():
    """docs/architecture.md's table is the code's floors (issue 53): a unit's floor there is 1 + the highest
    floor of the units it imports."""
    layers, _ = doc_tables()
    got = floors(unit_graph())
    wrong = {u: (layers.get(u), f) for u, f in got.items() if layers.get(u) != f}
    assert not wrong, "unit: (floor in the doc, floor of its imports): " + str(dict(sorted(wrong.items())))


def test_the_floors_of_a_small_graph():
    assert floors({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"c"}}) == {"a": 3, "b": 2, "c": 1, "d": 2}


def test_the_papers_core_imports_no_option():
    """``algorithms/`` (GRPO, AR, Lopti) never imports ``plugins/`` (the other methods) or anything but the
    config, directly or by name: the options register into the core's registries from above."""
    graph = unit_graph()
    assert graph["algorithms"] <= {"config"}, sorted(graph["algorithms"])
    named = [f"{p.relative_to(REPO)}:{line}" for p in sorted((SRC / "algorithms").rglob("*.py"))
             for target, line in named_imports(p) if unit_of(target) != "algorithms"]
    assert not named, named


def test_the_layer_table_names_whole_units_each_once():
    """Each folder (and each top-level file) is one unit in one layer: no module inside a unit is placed
    on its own, and every unit is placed."""
    layers, _ = doc_tables()
    assert not [n for n in layers if "." in n], "the layer table names folders and top-level files only"
    assert units() == set(layers), f"unplaced: {sorted(units() - set(layers))}; gone: {sorted(set(layers) - units())}"


def unit_graph() -> dict[str, set[str]]:
    """unit -> the other units it imports (any import, lazy ones too)."""
    graph: dict[str, set[str]] = {u: set() for u in units()}
    for path in SRC.rglob("*.py"):
        me = unit_of(module_name(path))
        for target, _ in arlopti_imports(path):
            them = unit_of(target)
            if them != me and them in graph:
                graph[me].add(them)
    return graph


def test_the_units_import_each_other_without_a_circle():
    """Folder by folder (the unit of the layer table), the import graph has no circle: within one layer
    as well as between layers."""
    graph = unit_graph()
    state: dict[str, int] = {}

    def visit(u: str, trail: list[str]) -> None:
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                raise AssertionError("circle: " + " -> ".join(trail[trail.index(v):] + [u, v]))
            if v not in state:
                visit(v, trail + [u] if v not in trail else trail)
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [])


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports between units, importer first: one floor per unit on it. A unit
    met again on the way (a circle, which the test above reports) ends the chain there."""
    best: dict[str, list[str]] = {}

    def chain(u: str, trail: frozenset) -> list[str]:
        if u not in best:
            below = [chain(v, trail | {u}) for v in sorted(graph[u]) if v not in trail | {u}]
            best[u] = [u] + max(below, key=len, default=[])
        return best[u]

    return max((chain(u, frozenset()) for u in sorted(graph)), key=len)


def test_the_units_stand_on_at_most_seven_floors():
    """Issue 33's measure of the house: with each folder and each top-level file as one unit, the
    longest chain of imports between units has at most 7 units (floors; 8 until issue 44 took the
    research out of the training path)."""
    chain = longest_chain(unit_graph())
    assert len(chain) <= 7, f"{len(chain)} floors: " + " -> ".join(chain)


#: The units a training run is made of (issue 44), and the research that stands above them.
TRAINING_PATH = ("callbacks", "learner", "rollout", "plugins", "algorithms", "tasks", "data", "models", "prompts",
                 "checkpoints", "ops", "config", "utils")
RESEARCH = ("analysis", "study")


def named_imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import by name in ``path``: ``import_module("arlopti.x")``,
    ``__import__``, ``runpy.run_module``, with the name written as a literal."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            name = node.args[0].value
            if func in ("import_module", "__import__", "run_module") and isinstance(name, str) \
                    and name.startswith("arlopti."):
                out.append((name[len("arlopti."):], node.lineno))
    return out


def test_the_training_path_reaches_no_research():
    """No module of the training path imports ``analysis`` or ``study``, directly, through another unit or
    by name: a training run never loads the research code (issue 44)."""
    graph = unit_graph()
    assert set(TRAINING_PATH) <= set(graph), "a unit of the training path is gone: update TRAINING_PATH"
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if unit_of(module_name(path)) in TRAINING_PATH:
            found += [f"{path.relative_to(REPO)}:{line}: {target}" for target, line in
                      arlopti_imports(path) + named_imports(path) if unit_of(target) in RESEARCH]
    assert not found, "the training path imports the research above it:\n" + "\n".join(found)
    for unit in TRAINING_PATH:
        seen, todo = set(), [unit]
        while todo:
            for v in graph[todo.pop()] - seen:
                seen.add(v)
                todo.append(v)
        assert not seen & set(RESEARCH), f"{unit} reaches {sorted(seen & set(RESEARCH))} through other units"


def test_the_floor_count_is_the_longest_chain():
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"c"}}
    assert longest_chain(graph) == ["a", "b", "c"]


def test_no_module_imports_another_files_private_name():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        me = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("arlopti"):
                target = node.module[len("arlopti."):] if node.module != "arlopti" else "__init__"
                if target == me:
                    continue
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {a.name} from {node.module}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "private names imported from another file (make them public or move them):\n" + "\n".join(found)


def test_every_module_belongs_to_a_layer():
    unplaced, _, _ = upward_imports()
    assert not unplaced, f"place these modules in docs/architecture.md's layer table: {unplaced}"


def test_no_import_climbs_to_a_higher_layer():
    _, upward, _ = upward_imports()
    assert not upward, "imports from a higher layer (move the code down, or document the exception):\n" + \
        "\n".join(upward)


def test_every_listed_exception_is_still_needed():
    _, _, used = upward_imports()
    _, allowed = doc_tables()
    assert used == allowed, f"exceptions no longer used (remove them from the doc): {sorted(allowed - used)}"


@pytest.mark.parametrize("module, layer", [("learner.module", "learner"), ("prompts.records", "prompts"),
                                           ("data.kk_datamodule", "data"), ("rollout.vllm", "rollout")])
def test_longest_prefix_decides(module, layer):
    layers, _ = doc_tables()
    assert owner(module, layers) == layer


#: The path a researcher reads to change the loss, config to the learner's step (issue 53), in reading order.
LOSS_PATH = ("algorithms/reweighting.py", "algorithms/isolation.py", "algorithms/plan.py", "algorithms/inputs.py",
             "algorithms/objective.py", "algorithms/policy_loss.py", "algorithms/aggregation.py", "learner/module.py")


def _option_names() -> set[str]:
    """What belongs to a method above the core: the rival losses' and token methods' registered names and
    rollout corrections, and the settings only they read."""
    import dataclasses

    import arlopti.plugins  # noqa: F401  (fills the registries)
    from arlopti.algorithms.policy_loss import CORE_LOSSES
    from arlopti.config.schema import LossParamsConfig, RolloutCorrectionConfig, TokenMethodConfig
    from arlopti.config.registries import POLICY_LOSSES, ROLLOUT_CORRECTIONS, TOKEN_METHODS

    names = (set(POLICY_LOSSES.names()) - set(CORE_LOSSES)) | set(TOKEN_METHODS.names()) - {"none"}
    names |= set(ROLLOUT_CORRECTIONS.names()) - {"none"}
    for cls in (LossParamsConfig, TokenMethodConfig, RolloutCorrectionConfig):
        names |= {f.name for f in dataclasses.fields(cls)} - {"name", "mode"}
    names -= {"reverse"}  # the token method shares its name with Lopti's own flag (lopti.reverse)
    return names | {"loss_params", "rollout_correction", "dist", "top_log_probs", "behaviour_log_probs",
                    "engine_logprobs", "empty_rows"}


def test_the_loss_path_is_short_and_free_of_the_options():
    """Issue 53's goals: the path to change the loss is at most 900 lines in at most 8 files, and no option's
    parameter, setting or name appears in it as code (identifiers, parameters, attributes, string constants);
    the learner's step reaches the options through one seam, ``plugins.run_options``."""
    lines = {p: len((SRC / p).read_text().splitlines()) for p in LOSS_PATH}
    assert len(lines) <= 8 and sum(lines.values()) <= 900, lines
    banned, found = _option_names(), []
    for p in LOSS_PATH:
        tree = ast.parse((SRC / p).read_text())
        for node in ast.walk(tree):
            words = []
            if isinstance(node, ast.arg):
                words = [node.arg]
            elif isinstance(node, ast.Name):
                words = [node.id]
            elif isinstance(node, ast.Attribute):
                words = [node.attr]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
                words = [node.value]
            found += [f"{p}:{node.lineno}: {w}" for w in words if w in banned]
    assert not found, "\n".join(found)
    plugins = [t for t, _ in arlopti_imports(SRC / "learner/module.py") if unit_of(t) == "plugins"]
    assert plugins == ["plugins.run_options"], plugins


def test_the_papers_functions_take_at_most_ten_parameters():
    from arlopti.algorithms import grpo_objective, policy_loss

    for fn in (grpo_objective, policy_loss):
        code = fn.__code__
        assert code.co_argcount + code.co_kwonlyargcount <= 10, fn.__name__


def test_no_function_is_longer_than_sixty_lines():
    long = [f"{p.relative_to(REPO)}:{n.lineno}: {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in sorted(SRC.rglob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, "\n".join(long)


def test_readmes_reading_order_is_the_loss_path():
    """README's reading order names the files of the loss path, in its order, and every file it links exists."""
    readme = (REPO / "README.md").read_text()
    part = readme.split("**Where they live: a reading order.**", 1)[1].split("## ", 1)[0]
    links = re.findall(r"\]\((src/arlopti/[\w/]+\.py)\)", part)
    assert all((REPO / link).is_file() for link in links), links
    named = [link[len("src/arlopti/"):] for link in links]
    in_path = [n for n in named if n in LOSS_PATH]
    assert in_path == list(LOSS_PATH), in_path
