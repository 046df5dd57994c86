"""Layers point one way (docs/architecture.md, Layers): a backward import fails this test.

Two more rules on the same import graph: no import cycle (one is only an accident of import order
away from a partially initialised module, and a ``TYPE_CHECKING`` or function-local import is the
same knot, only hidden), and no import of another package's private module (a package's ``__init__``
is its surface, its ``_name`` modules are its own business).
"""

from __future__ import annotations

import ast
import importlib
import itertools
import pkgutil
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import andon

SRC = Path(andon.__file__).parent

# The re-export modules count as the layer they re-export; the top-level package re-exports the
# supervisor's API.
ALIASES = {
    "andon": "supervisor",
    "andon.cancel": "base",
    "andon.errors": "base",
    "andon.tools": "workers",
    "andon.hooks": "supervisor",
    "andon.__main__": "cli",
}
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "procs": {"base"},
    "protocol": {"base"},
    "session": {"base", "procs"},
    "workers": {"base", "procs", "protocol"},
    "llm": {"base"},
    "fleet": {"base", "procs", "protocol", "workers"},
    "supervisor": {"base", "procs", "protocol", "session", "workers", "fleet", "llm"},
    "mcp": {"base", "procs", "protocol", "session", "workers", "fleet", "supervisor"},
    "testing": {"base", "procs", "llm", "session"},
    "cli": {
        *("base", "procs", "protocol", "session", "workers", "fleet", "llm"),
        *("supervisor", "mcp", "testing"),
    },
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in ALIASES and (n == len(parts) or prefix != "andon"):
            return ALIASES[prefix]
    if len(parts) >= 2 and parts[1] in ALLOWED:
        return parts[1]
    raise AssertionError(f"module {module} belongs to no layer; add it to the layer table")


def module_name(path: Path, root: Path = SRC.parent) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # ``from andon import procs`` imports the module andon.procs, not the package.
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            named = [m for m in submodules if _is_module(m)]
            found += [(node.lineno, m) for m in named] or [(node.lineno, target)]
    return [(line, name) for line, name in found if name == "andon" or name.startswith("andon.")]


def _is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def source_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_layer_table_covers_every_module() -> None:
    for path in source_files():
        layer_of(module_name(path))


def test_no_backward_imports() -> None:
    problems = []
    for path in source_files():
        module = module_name(path)
        own = layer_of(module)
        for line, target in imports_of(path, module):
            other = layer_of(target)
            if other != own and other not in ALLOWED[own]:
                problems.append(
                    f"{path.relative_to(SRC.parent)}:{line}: {own} imports {other} ({target})"
                )
    assert not problems, "backward imports:\n" + "\n".join(problems)


def test_layer_check_catches_a_backward_arrow(tmp_path: Path) -> None:
    bad = tmp_path / "andon" / "base" / "_bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from andon.supervisor import Agent\n")
    (target,) = imports_of(bad, "andon.base._bad")
    assert layer_of(target[1]) == "supervisor" not in ALLOWED["base"]


# --- the import graph: cycles and private modules ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Edge:
    """One import statement: ``source`` imports ``target`` at ``file:line``."""

    source: str
    target: str
    file: str
    """Relative to the source root, for messages."""
    line: int
    where: str
    """``""`` when it runs at import time; ``TYPE_CHECKING`` or ``function-local`` when hidden."""

    def __str__(self) -> str:
        hidden = f" ({self.where})" if self.where else ""
        return f"{self.file}:{self.line}: {self.source} -> {self.target}{hidden}"


@dataclass(frozen=True, slots=True)
class Cycle:
    chain: tuple[str, ...]
    """``a, b, ..., a``."""
    edges: tuple[Edge, ...]
    """Every import statement behind each arrow of the chain, in chain order."""

    def __str__(self) -> str:
        return " -> ".join(self.chain) + "".join(f"\n    {edge}" for edge in self.edges)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement, with where it runs (see :attr:`Edge.where`).

    Hidden imports count as edges: a ``TYPE_CHECKING`` import is a cycle the type checker still
    has to untangle, and a function-local one is an import-order accident postponed to run time.
    """
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += [(child, where or "TYPE_CHECKING") for child in node.body]
            stack += [(child, where) for child in node.orelse]  # the else branch runs
        else:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                where = where or "function-local"
            stack += [(child, where) for child in ast.iter_child_nodes(node)]


def modules_under(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the packages directly under ``root``."""
    return {module_name(path, root): path for path in sorted(root.glob("*/**/*.py"))}


def import_edges(root: Path) -> list[Edge]:
    """Every import of a module of our own package by another, for the tree under ``root``.

    ``from pkg.x import name`` is an edge to ``pkg.x.name`` when that is a module, else to
    ``pkg.x``. Importing ``pkg.x.y`` is an edge to ``pkg.x.y`` only, not to the package
    ``pkg.x`` whose ``__init__`` Python runs first: that ``__init__`` importing its own submodules
    is the normal re-export, and an edge back from a submodule to its package would make every
    such package a cycle. A submodule that names its package (``from pkg.x import A``) does get
    the edge, and then the re-export really is a cycle.
    """
    modules = modules_under(root)
    edges: list[Edge] = []
    for module, path in modules.items():
        top = module.partition(".")[0]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        file = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, where in _import_statements(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join([*base, node.module] if node.module else base)
                else:
                    origin = node.module or ""
                targets = [
                    f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                    for alias in node.names
                ]
            for target in dict.fromkeys(targets):
                if target.partition(".")[0] == top and target != module:
                    edges.append(Edge(module, target, file, node.lineno, where))
    return sorted(edges, key=lambda e: (e.file, e.line, e.target))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> Iterator[str]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return iter(sorted(graph.get(node, ())))

    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, visit(start))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    work.append((child, visit(child)))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    components.append(sorted(component))
    return sorted(components)


def _shortest_path(
    graph: dict[str, set[str]], start: str, goal: str, within: set[str]
) -> list[str]:
    came: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [node]
            while (prev := came[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for child in sorted(graph.get(node, ())):
            if child in within and child not in came:
                came[child] = node
                queue.append(child)
    raise AssertionError(f"{goal} is not reachable from {start} inside its component")


def import_cycles(edges: list[Edge]) -> list[Cycle]:
    """The import cycles: for every arrow inside a strongly connected component, the shortest
    cycle through it (so each arrow that takes part in a cycle is shown in one), deduplicated."""
    by_arrow: dict[tuple[str, str], list[Edge]] = {}
    graph: dict[str, set[str]] = {}
    for edge in edges:
        by_arrow.setdefault((edge.source, edge.target), []).append(edge)
        graph.setdefault(edge.source, set()).add(edge.target)
    cycles: dict[tuple[str, ...], Cycle] = {}
    for component in strongly_connected(graph):
        members = set(component)
        for source in component:
            for target in sorted(graph.get(source, set()) & members):
                ring = [source, *_shortest_path(graph, target, source, members)][:-1]
                first = ring.index(min(ring))  # one spelling per cycle, whatever arrow found it
                ring = ring[first:] + ring[:first]
                chain = (*ring, ring[0])
                cycles.setdefault(
                    chain,
                    Cycle(
                        chain,
                        tuple(e for a, b in itertools.pairwise(chain) for e in by_arrow[a, b]),
                    ),
                )
    return [cycles[chain] for chain in sorted(cycles)]


def private_owner(module: str) -> str | None:
    """The innermost package that ``module`` is private to, or None for a public module.

    ``pkg.x._y`` and ``pkg.x._y.z`` are private to ``pkg.x``; ``pkg.x._y._z`` to ``pkg.x._y``
    (a module of ``pkg.x`` may use ``pkg.x._y``, but ``_z`` is ``_y``'s own business). A
    top-level private module such as ``andon._x`` belongs to the package ``andon`` and so
    is open to every module of andon.
    """
    parts = module.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].startswith("_") and not parts[i].endswith("__"):
            return ".".join(parts[:i])
    return None


def private_imports(edges: list[Edge]) -> list[Edge]:
    """Imports of a private module from outside the package it is private to."""
    out = []
    for edge in edges:
        owner = private_owner(edge.target)
        if owner is not None and edge.source != owner and not edge.source.startswith(owner + "."):
            out.append(edge)
    return out


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_edges(SRC.parent))
    assert not cycles, "import cycles:\n" + "\n".join(map(str, cycles))


def test_no_imports_of_another_packages_private_module() -> None:
    found = private_imports(import_edges(SRC.parent))
    assert not found, "private modules imported from outside their package:\n" + "\n".join(
        map(str, found)
    )


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cycle_check_catches_hidden_cycles_and_spares_re_exports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "andon/__init__.py": "",
            # A package re-exporting its submodules, which import each other one way: no cycle.
            "andon/pkg/__init__.py": "from andon.pkg._a import A\nfrom andon.pkg import _b\n",
            "andon/pkg/_a.py": "import andon.pkg._b\nfrom andon.pkg._c import C\nA = 1\n",
            "andon/pkg/_b.py": "B = 1\n",
            # _a -> _c -> _a, the way back only for the type checker.
            "andon/pkg/_c.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from andon.pkg._a import A\n"
                "else:\n"
                "    import andon.pkg._b\n"
                "C = 1\n"
            ),
            # _d -> _e -> _d, the way back postponed into a function (and spelt relatively).
            "andon/pkg/_d.py": "from . import _e\n",
            "andon/pkg/_e.py": "def f() -> None:\n    from ._d import x\n",
            # A submodule that imports its own package back: the re-export is then a cycle.
            "andon/loop/__init__.py": "from andon.loop._x import X\n",
            "andon/loop/_x.py": "from andon.loop import Y\nX = 1\n",
        },
    )
    edges = import_edges(root)
    assert Edge("andon.pkg._c", "andon.pkg._b", "andon/pkg/_c.py", 5, "") in edges
    found = {
        cycle.chain: [(e.file, e.line, e.where) for e in cycle.edges]
        for cycle in import_cycles(edges)
    }
    assert found == {
        ("andon.loop", "andon.loop._x", "andon.loop"): [
            ("andon/loop/__init__.py", 1, ""),
            ("andon/loop/_x.py", 1, ""),
        ],
        ("andon.pkg._a", "andon.pkg._c", "andon.pkg._a"): [
            ("andon/pkg/_a.py", 2, ""),
            ("andon/pkg/_c.py", 3, "TYPE_CHECKING"),
        ],
        ("andon.pkg._d", "andon.pkg._e", "andon.pkg._d"): [
            ("andon/pkg/_d.py", 1, ""),
            ("andon/pkg/_e.py", 2, "function-local"),
        ],
    }


def test_cycle_check_reports_each_cycle_of_a_knot(tmp_path: Path) -> None:
    # One component, two cycles through a shared module (the shape of _agent, _turn, _subagent).
    root = _tree(
        tmp_path,
        {
            "andon/__init__.py": "",
            "andon/s/__init__.py": "",
            "andon/s/_agent.py": "from andon.s import _turn, _sub\n",
            "andon/s/_turn.py": "import andon.s._agent\n",
            "andon/s/_sub.py": "def f() -> None:\n    import andon.s._agent\n",
        },
    )
    cycles = import_cycles(import_edges(root))
    assert [c.chain for c in cycles] == [
        ("andon.s._agent", "andon.s._sub", "andon.s._agent"),
        ("andon.s._agent", "andon.s._turn", "andon.s._agent"),
    ]
    assert str(cycles[0]).splitlines() == [
        "andon.s._agent -> andon.s._sub -> andon.s._agent",
        "    andon/s/_agent.py:1: andon.s._agent -> andon.s._sub",
        "    andon/s/_sub.py:2: andon.s._sub -> andon.s._agent (function-local)",
    ]


def test_private_check_catches_a_foreign_private_import_and_spares_ones_own(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        {
            "andon/__init__.py": "",
            "andon/_top.py": "",  # private to the package andon itself: open to all of andon
            "andon/cli.py": "from andon import _top\nfrom andon.pkg import _helper_name\n",
            "andon/pkg/__init__.py": "from andon.pkg._impl import Thing\n",
            "andon/pkg/_impl.py": (
                "from andon.pkg._inner import Deep\nimport andon.pkg._inner._deep\n"
            ),
            "andon/pkg/_inner/__init__.py": "from ._deep import Deep\n",
            "andon/pkg/_inner/_deep.py": "Deep = 1\n",
            "andon/pkg/sub/__init__.py": "from andon.pkg._impl import Thing\n",  # inside pkg
            "andon/other/__init__.py": "",
            "andon/other/_user.py": (
                "from andon.pkg import Thing\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from andon.pkg._impl import Thing\n"
                "def f() -> None:\n"
                "    from andon.pkg._inner import Deep\n"
            ),
        },
    )
    found = [(e.source, e.target, e.line) for e in private_imports(import_edges(root))]
    assert found == [
        ("andon.other._user", "andon.pkg._impl", 4),
        ("andon.other._user", "andon.pkg._inner", 6),
        # _impl is in pkg, but _deep is private to pkg._inner, the innermost owner.
        ("andon.pkg._impl", "andon.pkg._inner._deep", 2),
    ]


def public_packages() -> list[str]:
    names = ["andon"]
    for info in pkgutil.walk_packages([str(SRC)], prefix="andon."):
        leaf = info.name.rpartition(".")[2]
        if not any(part.startswith("_") for part in info.name.split(".")) and leaf != "cli":
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", public_packages())
def test_all_lists_only_real_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which does not exist"
        assert not attr.startswith("_") or attr == "__version__"
