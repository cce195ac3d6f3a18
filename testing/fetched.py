"""A trainer's file fetched by hand (not part of this repository, not shipped): its rule's
constants and functions taken by their syntax tree and run on their own, so that the file's
transport and model imports (torch, transformers, aiohttp) are not needed, and the reference
imports nothing of ours."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any


def load(path: Path, functions: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The module-level constants and the named functions of ``path``, run in ``namespace``
    (the modules they use, e.g. ``{"re": re}``)."""
    tree = ast.parse(path.read_text(), str(path))
    kept = [
        node
        for node in tree.body
        if (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets))
        or (isinstance(node, ast.FunctionDef) and node.name in functions)
    ]
    assert {node.name for node in kept if isinstance(node, ast.FunctionDef)} == functions, path
    exec(compile(ast.Module(kept, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def attribute_text(path: Path, attribute: str) -> str:
    """The string literal a method of ``path`` assigns to ``self.<attribute>`` (one, exactly)."""
    found = [
        node.value.value
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Attribute)
        and node.targets[0].attr == attribute
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    assert len(found) == 1, (path, attribute, len(found))
    return found[0]


def load_module(path: Path, name: str) -> ModuleType:
    """The whole of ``path`` run as a module named ``name`` (its own imports needed)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
