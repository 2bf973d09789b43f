"""The package's floors: no import cycle, and no import from a lower layer up to a higher one.

Walks every module's imports with ``ast`` (lazy imports inside functions included): a package may import
only from itself and from the packages before it in :data:`LAYERS`, and the modules of one package must
not import each other in a circle.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cropcop_utils"

# The chain, bottom up: core and nets are the ground floor, synthetic is a data source, then the chapters in
# book order; the card is rendered by chapters 10 and 11; the explorer and the runner sit on top.
LAYERS = ("core", "nets", "synthetic", "corpus", "audit", "split", "probes", "training", "ptq", "runtime",
          "analysis", "card", "field", "abstention", "explorer", "<top>")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> set[str]:
    """The package's own modules that ``path`` imports (dotted, relative to the package)."""
    name = module_name(path, root)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "":
        here = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == root.name:
                target = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}" if target else alias.name
                found.add(full if full in modules else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == root.name}
    return {m for m in found if m != name}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    return {name: imports_of(path, root, set(paths)) for name, path in paths.items()}


def layer(module: str) -> str:
    top = module.split(".")[0]
    return top if top in LAYERS else "<top>"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if LAYERS.index(layer(d)) > LAYERS.index(layer(m)))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle or a knot of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ re-exports its modules, and a module importing a sibling through the package
    # (``from . import x``) resolves to the sibling itself: the __init__ is a façade, not a participant.
    packages = {m for m in graph if (PACKAGE / m.replace(".", "/") / "__init__.py").exists() or m == ""}
    return {m: {d for d in deps if d not in packages} for m, deps in graph.items() if m not in packages}


def test_every_top_level_package_has_a_layer():
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(LAYERS[:-1])


def test_no_import_climbs_to_a_higher_layer():
    assert upward_imports(import_graph()) == []


def test_no_import_cycle():
    assert cycles(without_package_inits(import_graph())) == []


@pytest.fixture
def planted_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "cropcop_utils"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "profiles", "templates"))
    return copy


def test_the_checks_catch_a_planted_upward_import(planted_copy: Path):
    metrics = planted_copy / "core" / "metrics.py"
    late = "\n\ndef _late():\n    from ..abstention import chapter  # noqa\n"
    metrics.write_text(metrics.read_text() + late)
    planted = import_graph(planted_copy)
    assert upward_imports(planted) == ["core.metrics -> abstention.chapter"]


def test_the_checks_catch_a_planted_cycle(planted_copy: Path):
    (planted_copy / "core" / "ring_a.py").write_text("from .ring_b import b\n\na = 1\n")
    (planted_copy / "core" / "ring_b.py").write_text("from . import ring_a\n\nb = 2\n")
    planted = import_graph(planted_copy)
    graph = {m: d for m, d in planted.items()}
    assert ["core.ring_a", "core.ring_b"] in cycles(graph)
