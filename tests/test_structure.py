"""The package's shape: no module imports, directly or through others, a module that imports it back.

The import graph is read from the source with `ast`: every `from .x import ...`, `from . import x` and
`import graphscribe.x`, at module level or inside a function, is an edge. Imports under `if TYPE_CHECKING:` are
left out: they name types for annotations and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "graphscribe"
SOURCE = Path(__file__).parent.parent / "src" / PACKAGE

KNOWN_CYCLES: set[frozenset[str]] = set()  # none: every import cycle fails the test


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The package's modules (of `modules`) that a top-level module's source imports, anywhere in it."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 0 and node.module and node.module.split(".")[0] == PACKAGE):
                parts = (node.module or "").split(".")
                parts = parts[1:] if node.level == 0 else parts
                if parts and parts[0]:
                    found.add(parts[0])  # from .x import y, from graphscribe.x import y
                else:
                    found.update(alias.name for alias in node.names)  # from . import x, from graphscribe import x
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found & modules


def import_graph(folder: Path = SOURCE) -> dict[str, set[str]]:
    """Module name -> the package's modules it imports."""
    sources = {path.stem: path.read_text(encoding="utf-8") for path in folder.glob("*.py")}
    modules = set(sources)
    return {name: imports_of(source, modules) for name, source in sources.items()}


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components that hold a cycle (Tarjan): two or more modules, or one importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert {"model", "encoder", "encoder_kernels", "pipeline"} <= set(graph)
    new = cycles(graph) - KNOWN_CYCLES
    assert not new, f"import cycles: {[sorted(c) for c in new]}"


def test_the_reader_sees_every_form_of_import():
    modules = {"a", "b", "c", "d", "e", "f"}
    source = """
from .a import x
from . import b
import graphscribe.c
from graphscribe import d as other
import torch
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .f import F

def later():
    from .e import y
"""
    assert imports_of(source, modules) == {"a", "b", "c", "d", "e"}


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == {frozenset({"a", "b", "c"}), frozenset({"e"})}
    assert cycles({"a": {"b"}, "b": set()}) == set()
