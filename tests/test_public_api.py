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
    "andon.procs",
    "andon.protocol",
    "andon.session",
    "andon.workers",
    "andon.llm",
    "andon.fleet",
    "andon.supervisor",
    "andon.mcp",
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
        if not hasattr(module, "__path__") and getattr(value, "__module__", name) != name:
            continue  # a one-module layer (andon.procs) imports names for its own use
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


# -- the user tier ------------------------------------------------------------------------------
# Which names are for users (docs/architecture.md, Who the names are for). Users get a stability
# promise for these and only these; every other public name exists so that layers can import each
# other, may change in any release, and lives either in an internal face or beside user names in a
# face that serves both.

USER_FACES = frozenset(
    {"andon", "andon.cancel", "andon.errors", "andon.hooks", "andon.tools", "andon.supervisor"}
)
"""Faces whose every name is for users."""

USER_NAMES: dict[str, frozenset[str]] = {
    # Reading a log: read, stream, load (lock and repair), check, the messages a model sees, a
    # transcript, and the typed records themselves (what Agent.events() yields besides live events).
    "andon.session": frozenset(
        {
            "FORMAT_VERSION",
            "LoadedSession",
            "InvariantViolation",
            "Record",
            "EventData",
            "RepairReport",
            "check",
            "history",
            "iter_records",
            "load",
            "read",
            "render_transcript",
            "repair",
            # the log as OpenTelemetry-shaped spans (andon trace)
            "trace_of",
            "Trace",
            "Span",
            "SpanEvent",
            # what Agent.events() yields: the records and the live events beside them
            "AgentEvent",
            "LiveEvent",
            "event_from_dict",
            "AgentError",
            "AgentStatus",
            "AssistantDelta",
            "Status",
            "SubagentEvent",
            "ToolOutput",
            # the records' data
            "AssistantChunk",
            "UserMessageEntered",
            "TurnEndReason",
            "Blocked",
            "Completed",
            "Interrupted",
            "MaxTokens",
            "TurnAborted",
            "TurnFailed",
            "Block",
            "ReasoningBlock",
            "TextBlock",
            "ToolCallBlock",
            "AssistantMessage",
            "AssistantReply",
            "ContextCompacted",
            "ContextTrimmed",
            "ExitStatus",
            "InboxSpliced",
            "LlmRequest",
            "LlmRetry",
            "ModelInfo",
            "ProjectInstructions",
            "SessionRepaired",
            "SessionResumed",
            "SessionStart",
            "StepEnd",
            "StepStart",
            "ToolCall",
            "ToolErrorInfo",
            "ToolResult",
            "ToolSignal",
            "ToolStarted",
            "TurnEnd",
            "TurnStart",
            "Unrecognized",
            "UserMessage",
        }
    ),
    # The Model protocol, its stream, and the adapters a user picks or writes.
    "andon.llm": frozenset(
        {
            "API_KEY_ENV_VARS",
            "DEEPSEEK_MODELS",
            "Chunk",
            "Finish",
            "FinishReason",
            "Model",
            "ModelIdentity",
            "ModelRequest",
            "OpenAICompatible",
            "ReasoningDelta",
            "ResponseSchema",
            "RetryPolicy",
            "ScriptFailure",
            "ScriptReply",
            "ScriptToolCall",
            "Scripted",
            "TextDelta",
            "ToolCallDelta",
            "Usage",
            "from_spec",
        }
    ),
    # The pool, its observer, the launchers and the seam a custom launcher implements.
    "andon.fleet": frozenset(
        {
            "CommandLauncher",
            "ContainerLauncher",
            "ForkserverLauncher",
            "LaunchedWorker",
            "Mount",
            "PodLauncher",
            "PoolObserver",
            "PoolSetup",
            "PoolStatistics",
            "TcpListen",
            "WorkerLauncher",
            "WorkerPool",
            "WorkerPoolConfig",
            "WorkerSpec",
            "host_mounts",
        }
    ),
    # What a user's own tests start: the mock model server and the stand-in Kubernetes API.
    "andon.testing": frozenset(
        {"FakeKubernetes", "MockModelServer", "OVERFLOW_SHAPES", "RecordedRequest"}
    ),
}
"""Faces that serve users and other layers alike: the names for users."""

INTERNAL_FACES = frozenset(
    {
        *("andon.base", "andon.procs", "andon.protocol", "andon.workers", "andon.mcp"),
        *("andon.cli", "andon.cli.bench"),
    }
)
"""Faces with no name for users (what users need of them is re-exported by a user face)."""


def _user_tier_section() -> str:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    start = text.index("## Who the names are for")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_face_is_placed_in_one_tier() -> None:
    placed = [*USER_FACES, *USER_NAMES, *INTERNAL_FACES]
    assert sorted(placed) == sorted(PACKAGES)


@pytest.mark.parametrize("face", sorted(USER_NAMES))
def test_the_user_names_are_there(face: str) -> None:
    exported = set(importlib.import_module(face).__all__)
    assert USER_NAMES[face] <= exported, sorted(USER_NAMES[face] - exported)


def test_the_docs_name_the_user_tier() -> None:
    section = _user_tier_section()
    missing = [f"`{face}`" for face in sorted(PACKAGES) if f"`{face}`" not in section]
    missing += [
        f"{face}: `{name}`"
        for face, names in sorted(USER_NAMES.items())
        for name in sorted(names)
        if f"`{name}`" not in section
    ]
    assert not missing, "docs/architecture.md, Who the names are for, lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("face", sorted(INTERNAL_FACES))
def test_an_internal_face_says_so(face: str) -> None:
    doc = importlib.import_module(face).__doc__ or ""
    assert "internal" in doc.lower(), f"{face}'s docstring does not say it is internal"


OPEN_CLASSES: dict[str, str] = {
    # name -> why a user (or andon) may subclass it
    "AndonError": "the root of the exception tree",
    "ProtocolError": "a branch of the exception tree",
    "SessionError": "a branch of the exception tree",
    "WorkerError": "a branch of the exception tree",
    "ConfigError": "a branch of the exception tree",
    "AbortSignal": "a linked signal is one",
    "Model": "the protocol a model adapter implements",
    "WorkerLauncher": "the seam a launcher of one's own implements",
    "LaunchedWorker": "what a launcher of one's own hands back",
    "ForkserverLauncher": "a launcher may be specialised (how a worker starts, what it runs)",
    "CommandLauncher": "a launcher may be specialised (how a worker starts, what it runs)",
    "ContainerLauncher": "a launcher may be specialised (how a worker starts, what it runs)",
    "PodLauncher": "a launcher may be specialised (how a worker starts, what it runs)",
    "PoolObserver": "a user's observer overrides what it watches",
    "ExecutionObserver": "a user's observer overrides what it watches",
    "ToolProvider": "the protocol a source of tools implements (andon.mcp's servers)",
}
"""The user tier's classes meant to be subclassed; every other one is ``@final``."""


def _user_classes() -> dict[str, type]:
    import enum
    import inspect

    found: dict[str, type] = {}
    for face in sorted(USER_FACES | set(USER_NAMES)):
        module = importlib.import_module(face)
        names = module.__all__ if face in USER_FACES else sorted(USER_NAMES[face])
        for n in names:
            value = getattr(module, n)
            if inspect.isclass(value) and not issubclass(value, enum.Enum):
                found[n] = value
    return found


def test_the_user_tiers_leaf_classes_are_final() -> None:
    classes = _user_classes()
    open_but_final = [n for n in OPEN_CLASSES if getattr(classes.get(n), "__final__", False)]
    assert not open_but_final, open_but_final
    unknown = sorted(set(OPEN_CLASSES) - set(classes))
    assert not unknown, f"OPEN_CLASSES names what the user tier lacks: {unknown}"
    not_final = sorted(
        n
        for n, c in classes.items()
        if n not in OPEN_CLASSES and not getattr(c, "__final__", False)
    )
    assert not not_final, f"user-tier classes neither @final nor open on purpose: {not_final}"
