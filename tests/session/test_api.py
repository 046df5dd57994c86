"""The public surface of andon.session and its place in the layering."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import andon.session

PACKAGE = Path(andon.session.__file__).parent
ALLOWED = {"andon.base", "andon.procs", "psutil"}


def test_all_is_explicit_sorted_and_complete() -> None:
    names = andon.session.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(andon.session, name), name
    public = {n for n in vars(andon.session) if not n.startswith("_")}
    modules = {n for n in public if isinstance(getattr(andon.session, n), type(andon))}
    assert public - modules == set(names)


def test_the_architecture_names_are_public() -> None:
    for name in (
        "Record",
        "LoadedSession",
        "InvariantViolation",
        "ConsumedWork",
        "read",
        "iter_records",
        "load",
        "check",
        "history",
        "fold_consumed_work",
        "fold_state",
        "render_transcript",
        "repair",
        "SessionLog",
    ):
        assert name in andon.session.__all__, name


def test_public_callables_have_docstrings() -> None:
    for name in andon.session.__all__:
        obj = getattr(andon.session, name)
        if callable(obj) and getattr(obj, "__module__", "").startswith("andon.session"):
            assert obj.__doc__, name


def test_session_imports_only_base_procs_stdlib_and_psutil() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "andon":
                targets = [f"andon.{alias.name}" for alias in node.names]  # a module of andon
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if target.startswith("andon.session") or top == "__future__" or top in stdlib:
                    continue
                assert any(target == a or target.startswith(a + ".") for a in ALLOWED), (
                    f"{path.name} imports {target}"
                )
