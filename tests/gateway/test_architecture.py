"""The shape of gateway/: no import loop, and every part imports only the parts below it.

The import graph is read from the source with ``ast``: every import counts, those under
``if TYPE_CHECKING:`` and those inside functions included, since each is coupling that
a reader has to follow. The layers are docs/architecture/gateway.md's ("The gateway's layout").
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "gateway"

# Top to bottom: a part may import the parts of the layers below its own, never one of
# its own layer or above. A part is a subpackage, or a module at the top of gateway/.
LAYERS: list[set[str]] = [
    {"cli"},
    {"runtime"},
    {"app"},
    {"http"},
    {"request"},
    {"relay"},
    {"admission"},
    {"telemetry"},
    {"backends"},
    {"store"},
    {"context", "errors", "background", "version", "keys_client"},
    {"config"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The gateway modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from gateway.x import y` imports the module gateway.x.y when there is one
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``edges`` (as the modules along it, the first again last)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def part(module: str) -> str:
    """The subpackage (or top-level module) of gateway/ that ``module`` belongs to."""
    return module.split(".")[1]


def layer(module: str) -> int:
    name = part(module)
    for i, parts in enumerate(LAYERS):
        if name in parts:
            return i
    raise AssertionError(f"{module}: {name!r} is in no layer of LAYERS: place it there")


def test_the_graph_is_read_from_every_kind_of_import() -> None:
    edges = graph()
    assert "gateway.store.base" in edges["gateway.store.memory"]  # from-import of a module
    assert "gateway.config.schema" in edges["gateway.context"]  # under TYPE_CHECKING
    assert "gateway.app" in edges["gateway.runtime.workers"]  # inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_loop() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", sorted(modules()))
def test_each_part_imports_only_the_layers_below(module: str) -> None:
    if module == "gateway":
        return
    own = layer(module)
    wrong = sorted(
        target
        for target in graph()[module]
        if part(target) != part(module) and layer(target) <= own
    )
    assert not wrong, f"{module} ({part(module)}) imports {wrong}, not below it"


def test_records_and_errors_are_leaves() -> None:
    edges = graph()
    assert edges["gateway.errors"] == set()
    assert edges["gateway.context"] <= {"gateway.config.schema"}
