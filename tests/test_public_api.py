"""Each package's ``__all__`` is its public API and nothing more (docs/architecture.md, Layers).

Checked both ways: every name in ``__all__`` is there, and every public name the package binds is
in ``__all__`` (a name imported into ``__init__`` only for its own use takes an underscore). And a
public name means one thing: two packages that both export ``Reject`` export the same object, or a
user who imports the wrong one gets something else than the docs describe.
"""

from __future__ import annotations

import importlib
import types
from collections import defaultdict

import pytest

PACKAGES = (
    "andon",
    "andon.base",
    "andon.protocol",
    "andon.session",
    "andon.workers",
    "andon.llm",
    "andon.fleet",
    "andon.supervisor",
    "andon.testing",
    "andon.cli",
    "andon.cli.bench",
    "andon.cancel",
    "andon.errors",
    "andon.hooks",
    "andon.tools",
)


def export_problems(module: types.ModuleType) -> list[str]:
    """What is wrong with ``module.__all__``, one sentence per name."""
    name = module.__name__
    exported = getattr(module, "__all__", None)
    if exported is None:
        return [f"{name} has no __all__"]
    problems = [f"{name}.__all__ names {n!r} twice" for n in set(exported) if exported.count(n) > 1]
    problems += [
        f"{name}.__all__ names {n!r}, which {name} does not have"
        for n in exported
        if not hasattr(module, n)
    ]
    # A lazy package (PEP 562) binds its names on first use: dir() is its declared surface.
    bound = set(dir(module)) if hasattr(module, "__getattr__") else set(vars(module))
    for n in sorted(bound - set(exported)):
        if n.startswith("_") or n in {"annotations", "TYPE_CHECKING"}:
            continue
        value = getattr(module, n)
        if isinstance(value, types.ModuleType):
            continue  # a submodule (bound by the import system) or a module it imported
        problems.append(f"{name} binds the public name {n!r}, which is not in its __all__")
    return problems


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_the_public_api(name: str) -> None:
    problems = export_problems(importlib.import_module(name))
    assert not problems, "\n".join(problems)


def test_a_public_name_means_one_thing() -> None:
    meanings: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in PACKAGES:
        module = importlib.import_module(name)
        for n in module.__all__:
            value = getattr(module, n)
            if isinstance(value, types.ModuleType):
                continue
            meanings[n][id(value)].append(name)
    clashes = [
        f"{n}: " + " vs ".join(", ".join(where) for where in objects.values())
        for n, objects in sorted(meanings.items())
        if len(objects) > 1
    ]
    assert not clashes, "\n".join(clashes)


def test_the_checker_sees_a_missing_and_an_extra_name() -> None:
    fake = types.ModuleType("fake")
    fake.__all__ = ["there", "missing"]  # type: ignore[attr-defined]
    fake.there = 1  # type: ignore[attr-defined]
    fake.extra = 2  # type: ignore[attr-defined]
    fake._private = 3  # type: ignore[attr-defined]
    assert export_problems(fake) == [
        "fake.__all__ names 'missing', which fake does not have",
        "fake binds the public name 'extra', which is not in its __all__",
    ]
