"""The package's architecture, enforced: imports point down, no cycles, no private names across modules.

Every ``import`` and ``from ... import`` in ``ckptmerge/`` counts, at module level or inside a
function (a late import that climbs back up is still a climb), except those under
``if TYPE_CHECKING:``, which never run. A plan reaching its renderer or its
backend does so late-bound, by module name (``importlib.import_module``), which this walk does not
see on purpose: that is the one sanctioned way up. The layers, top to bottom, are documented in
docs/architecture.md and in each folder's package docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ckptmerge"

#: top to bottom; a module may import its own layer or any layer below it, never one above
LAYERS: List[Tuple[str, ...]] = [
    ("cli", "__main__"),
    ("__init__", "demo"),
    ("api", "restorer"),
    ("config",),
    ("merging",),
    ("combining",),
    ("following",),
    ("sources",),
    ("restoring",),
    ("render",),
    ("planning",),
    ("alignment",),
    ("formats",),
    ("core",),
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _modules() -> Dict[str, Tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


MODULES = _modules()


def _runtime_nodes(tree: ast.AST):
    """Every node of the tree but those under ``if TYPE_CHECKING:`` (imports for type hints only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports() -> List[Tuple[str, str, str, int]]:
    """(importer, imported module, imported name or '', line) for every import of ours."""
    out = []
    for mod, (path, is_pkg) in MODULES.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out += [(mod, a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "ckptmerge"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "ckptmerge":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    out.append((mod, sub, "", node.lineno) if sub in MODULES else (mod, target, alias.name, node.lineno))
    return out


IMPORTS = _imports()


def _layer(mod: str) -> int:
    parts = mod.split(".")
    return RANK[parts[1] if len(parts) > 1 else "__init__"]


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if (m.split(".")[1] if "." in m else "__init__") not in RANK)
    assert not unplaced, f"modules outside every layer (add them to LAYERS and docs/architecture.md): {unplaced}"


def test_imports_point_down():
    up = sorted(f"{a}:{line} imports {b}" for a, b, _, line in IMPORTS
                if b in MODULES and _layer(b) < _layer(a))
    assert not up, "imports that climb a layer:\n" + "\n".join(up)


def test_no_import_cycles():
    graph: Dict[str, Set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in IMPORTS:
        if b in MODULES and b != a:
            graph[a].add(b)
    # Tarjan's strongly connected components, iteratively
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_crosses_a_module():
    private = sorted(f"{a}:{line} imports {name} from {b}" for a, b, name, line in IMPORTS
                     if name.startswith("_") and not name.startswith("__") and b != a)
    assert not private, "private names imported across modules (promote or move them):\n" + "\n".join(private)


@pytest.mark.parametrize("package", sorted(m for m, (_, is_pkg) in MODULES.items() if is_pkg))
def test_every_folder_says_what_it_holds_and_may_import(package):
    path, _ = MODULES[package]
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc, f"{path} has no package docstring"
    if package.count(".") >= 1 and package != "ckptmerge.cli":
        assert "May import" in doc, f"{path}'s docstring does not say what the folder may import"


def test_at_most_twelve_modules_sit_at_the_top_of_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules at the top of ckptmerge/ (give the idea a folder): {top}"


#: what every format family shares, and the only modules at the top of formats/
FORMATS_SHARED = {"__init__", "base", "dtypes", "ranges", "whole"}


def test_formats_are_one_folder_per_family():
    loose = sorted(p.stem for p in (PACKAGE / "formats").glob("*.py") if p.stem not in FORMATS_SHARED)
    assert not loose, f"formats/ modules outside a family folder (formats/<family>/): {loose}"
    families = sorted(p.parent.name for p in (PACKAGE / "formats").glob("*/__init__.py"))
    assert {"tf", "keras", "safetensors", "numpy", "orbax", "io"} <= set(families), families


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_800_lines(module):
    path, _ = MODULES[module]
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 800, f"{path} has {lines} lines; split it by idea"
