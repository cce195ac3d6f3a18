"""The code reads in one direction: no import cycle among the repository's modules, counting
every import (inside functions and under ``TYPE_CHECKING`` too), ``common/`` never imports
a service (the registry names them as strings), ``common/``'s packages import only the layers
below their own (``LAYERS``), and no module imports a test module (shared fixtures live in
conftest.py, shared helpers in ``testing/``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "services", "bench", "tests", "testing", "deploy")
# common/'s packages by layer, lowest first (docs/ARCHITECTURE.md §1): a package imports its own
# modules and those of lower layers only; packages of one layer import neither the other.
LAYERS = {
    "limits": 0,
    "configuration": 1,
    "sdk": 1,
    "models": 2,
    "imaging": 2,
    "pipeline": 3,
    "setup": 4,
    "server": 5,
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The repository modules ``name`` imports anywhere in its source, with their packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    edges = set()
    for target in targets:
        parts = target.split(".")
        edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known)
    edges.discard(name)
    # A module's own packages are imported before it: not an edge of its own making.
    return {edge for edge in edges if not name.startswith(edge + ".")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
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


def test_no_import_cycles() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert not cycles(graph)


def test_common_imports_no_service() -> None:
    known = modules()
    offenders = {
        name: sorted(t for t in imports(name, path, known) if t.startswith("services"))
        for name, path in known.items()
        if name.startswith("common")
    }
    assert not {name: targets for name, targets in offenders.items() if targets}


def layer_of(name: str) -> str | None:
    """The package of ``common`` that module ``name`` belongs to (``common.limits.errors`` -> ``limits``)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "common" and len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module of a ``common`` package -> the modules it imports from a package not below its own."""
    found = {}
    for name, targets in graph.items():
        own = layer_of(name)
        if own is not None:
            wrong = [t for t in targets if layer_of(t) not in (None, own) and LAYERS[layer_of(t)] >= LAYERS[own]]
            if wrong:
                found[name] = sorted(wrong)
    return found


def test_common_is_its_packages_and_each_says_what_it_holds() -> None:
    """No module lies flat in ``common/``; each package is a layer and opens with a docstring."""
    assert sorted(path.stem for path in (ROOT / "common").glob("*.py")) == ["__init__"]
    packages = sorted(path.parent.name for path in (ROOT / "common").glob("*/__init__.py"))
    assert packages == sorted(LAYERS)
    for package in packages:
        init = ROOT / "common" / package / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"common/{package}/__init__.py has no docstring"


def test_common_packages_import_only_lower_layers() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items() if name.startswith("common.")}
    assert not upward_imports(graph)


def test_an_upward_or_sideways_import_is_found() -> None:
    graph = {
        "common.limits.errors": {"common.server.app"},
        "common.sdk.wire": {"common.configuration.config", "common.limits.errors", "common"},
        "common.server.app": {"common.server.worker", "common.pipeline.scorer"},
    }
    assert upward_imports(graph) == {
        "common.limits.errors": ["common.server.app"],
        "common.sdk.wire": ["common.configuration.config"],
    }


def is_test_module(name: str) -> bool:
    """A module pytest collects (``tests/**/test_*.py``) or loads itself (``conftest.py``)."""
    last = name.rpartition(".")[2]
    return name.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def test_no_module_imports_a_test_module() -> None:
    known = modules()
    offenders = {name: sorted(filter(is_test_module, imports(name, path, known))) for name, path in known.items()}
    assert not {name: targets for name, targets in offenders.items() if targets}


def test_an_import_of_a_test_module_is_found_in_every_form(tmp_path: Path) -> None:
    known = {"tests.code.test_a": tmp_path / "a.py", "tests.conftest": tmp_path / "c.py", "tests.code": tmp_path}
    for source in (
        "from tests.code import test_a",
        "from tests.code.test_a import ENV",
        "import tests.code.test_a",
        "from .test_a import ENV",
        "def f():\n    from tests.conftest import X",
    ):
        (tmp_path / "b.py").write_text(source)
        assert set(filter(is_test_module, imports("tests.code.test_b", tmp_path / "b.py", known))), source


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_sandbox_bundle_ships_every_module_inside_and_they_import_nothing_else() -> None:
    """``services/code/sandbox/inside/`` is shipped into the sandbox as the modules ``MODULES``
    names: a module left out fails only when a sandbox imports it. Inside, a module imports the
    standard library and its siblings alone (the sandbox's root holds no checkout)."""
    from services.code.sandbox.inside import MODULES

    inside = ROOT / "services" / "code" / "sandbox" / "inside"
    assert sorted(MODULES) == sorted(path.stem for path in inside.glob("*.py") if path.stem != "__init__")
    known = modules()
    outside = {
        name: sorted(t for t in imports(name, path, known) if not t.startswith("services.code.sandbox.inside"))
        for name, path in known.items()
        if name.startswith("services.code.sandbox.inside")
    }
    assert not {
        name: targets
        for name, targets in outside.items()
        if set(targets) - {"services", "services.code", "services.code.sandbox"}
    }
