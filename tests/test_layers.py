"""Layers point one way (architecture.md, Layering): a backward import fails this test."""

from __future__ import annotations

import ast
import importlib
import pkgutil
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
    "andon.cli": "cli",
    "andon._cli_run": "cli",
    "andon._cli_output": "cli",
    "andon._cli_settings": "cli",
    "andon._cli_chat": "cli",
    "andon._cli_term": "cli",
    "andon._bench": "cli",
}
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "protocol": {"base"},
    "session": {"base"},
    "workers": {"base", "protocol"},
    "llm": {"base"},
    "supervisor": {"base", "protocol", "session", "workers", "llm"},
    "testing": {"base", "llm", "session"},
    "cli": {"base", "protocol", "session", "workers", "llm", "supervisor", "testing"},
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


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
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
            found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "andon" or name.startswith("andon.")]


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
