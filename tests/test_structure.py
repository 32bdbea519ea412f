"""The package's shape: layers without import cycles, and modules a reader can take in whole.

The import graph is read from the source with `ast`: every `from .x import ...`, `from graphscribe.a.b import c`,
`from . import x` and `import graphscribe.a.b`, at module level, inside a function or under `if TYPE_CHECKING:`,
is an edge. An import for annotations only still ties the two modules' designs together, so it counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "graphscribe"
SOURCE = Path(__file__).parent.parent / "src" / PACKAGE
MAX_LINES = 600  # a module a reader can hold in mind; past it, it has two subjects

# The layers, lowest first: a module imports only from its own layer or below. The Python API (`api`, with
# `console`, what the commands share) sits on the runtime; the server on the API; the front ends on top.
LAYERS = ["io", "model", "output", "runtime", "api", "serve", ""]
API_LAYER = {"api", "console"}


def module_names(folder: Path = SOURCE) -> dict[str, Path]:
    """Dotted module name under the package ("io.audio", "api", "serve") -> its file."""
    names = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def imports_of(source: str, modules: set[str], here: str = "") -> set[str]:
    """The package's modules (of `modules`) that the source of module `here` imports, anywhere in it."""
    found: set[str] = set()
    package = here.rpartition(".")[0] if here else ""

    def add(target: str, names: list[str]) -> None:
        for name in names:
            if f"{target}.{name}".strip(".") in modules:
                found.add(f"{target}.{name}".strip("."))  # from graphscribe.io import audio
            elif target in modules:
                found.add(target)  # from graphscribe.io.audio import read_audio

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *((node.module or "").split(".") if node.module else [])])
            elif node.module and node.module.split(".")[0] == PACKAGE:
                target = node.module.partition(".")[2]
            else:
                continue
            add(target, [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1 and ".".join(parts[1:]) in modules:
                    found.add(".".join(parts[1:]))
    return (found & modules) - {"", here}


def import_graph(folder: Path = SOURCE) -> dict[str, set[str]]:
    """Module name -> the package's modules it imports (the package's own `__init__` left out: it only re-exports)."""
    names = module_names(folder)
    modules = set(names) - {""}
    return {name: imports_of(path.read_text(encoding="utf-8"), modules, name) for name, path in names.items() if name}


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
    assert {"api", "model.encoder", "model.encoder_kernels", "runtime.pipeline", "serve.server"} <= set(graph)
    found = cycles(graph)
    assert not found, f"import cycles: {[sorted(c) for c in found]}"


def _layer(module: str) -> int:
    top = "api" if module in API_LAYER else module.split(".")[0]
    return LAYERS.index(top if top in LAYERS else "")


def test_layers_import_only_downwards():
    upward = [
        (module, other)
        for module, imported in import_graph().items()
        for other in imported
        if _layer(other) > _layer(module)
    ]
    assert not upward, f"imports from a higher layer: {sorted(upward)}"


def test_no_module_is_too_long_to_read():
    long = {name: n for name, path in module_names().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_reader_sees_every_form_of_import():
    modules = {"a", "b", "c", "d", "e", "f", "g.h", "g.i", "g"}
    source = """
from .a import x
from graphscribe import b
import graphscribe.c
from graphscribe import d as other
import torch
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .f import F
from graphscribe.g.h import y
from graphscribe.g import i

def later():
    from .e import y
"""
    assert imports_of(source, modules, "m") == {"a", "b", "c", "d", "e", "f", "g.h", "g.i"}
    assert imports_of("from .h import x\nfrom ..a import y", modules, "g.i") == {"g.h", "a"}


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == {frozenset({"a", "b", "c"}), frozenset({"e"})}
    assert cycles({"a": {"b"}, "b": set()}) == set()


# Modules of Triton kernels: they import Triton at their top, and are imported themselves through
# `model.import_kernels`, under the one lock that keeps two threads from importing Triton at once.
KERNEL_MODULES = {"model.encoder_kernels", "model.step_kernels", "model.beam_kernels", "model.chain_kernels",
                  "model.fused_step"}  # fmt: skip


def unlocked_triton_imports(source: str) -> list[int]:
    """Lines that import Triton or a kernel module outside a `with TRITON_IMPORT:` block."""
    kernels = {name.rpartition(".")[2] for name in KERNEL_MODULES}
    found: list[int] = []

    def visit(node: ast.AST, locked: bool) -> None:
        if isinstance(node, ast.With):
            locked = locked or any(ast.unparse(item.context_expr).endswith("TRITON_IMPORT") for item in node.items)
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        else:
            names = []
        if not locked and any(n.split(".")[0] == "triton" or n.rpartition(".")[2] in kernels for n in names):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, locked)

    visit(ast.parse(source), False)
    return found


def test_triton_is_imported_under_one_lock():
    """On the GPU a server's priming thread and its first batch imported Triton at once: "partially initialized
    module 'triton.runtime.cache'", and the fused encoder kernels stayed off for the process."""
    unlocked = {
        name: lines
        for name, path in module_names().items()
        if name not in KERNEL_MODULES and (lines := unlocked_triton_imports(path.read_text()))
    }
    assert unlocked == {}, f"import Triton's kernels through model.import_kernels, or under TRITON_IMPORT: {unlocked}"
    assert unlocked_triton_imports("def f():\n    from graphscribe.model import encoder_kernels\n") == [2]
    assert unlocked_triton_imports("def f():\n    from triton.runtime.cache import triton_key\n") == [2]
    assert unlocked_triton_imports("with TRITON_IMPORT:\n    import triton\n") == []
