"""What every CLI session opens with (``andon run``, ``resume`` and ``chat``): what an existing
session's log says, the model its settings name, its working directory, system prompt and project
instructions, its context window and the ``open_agent`` options they give, in one place so that a
setting cannot reach one command and miss another."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from andon.base import ConfigError, LogCorrupted, LogFormatUnsupported, name_path
from andon.cli._kubernetes import pool_tcp
from andon.cli._remote import remote_launcher, remote_listen
from andon.cli._sessions import runtime_root
from andon.cli._settings import Settings, read_system_prompt
from andon.cli._workers import launcher_of
from andon.llm import Model, Scripted, from_spec, known_context_window
from andon.session import LogSummary, SessionStart, SessionState, summarize

if TYPE_CHECKING:
    from andon.supervisor import FoundInstructions
    from andon.workers import ToolRegistry

__all__ = [
    "DISCOVERY_TIMEOUT",
    "Existing",
    "JobBase",
    "agent_options",
    "context_window_for",
    "job_base",
    "load_model",
    "project_instructions",
    "read_existing",
    "refuse_invalid",
]

_log = logging.getLogger("andon.cli")

DISCOVERY_TIMEOUT: Final = 3.0
"""How long a run waits, at most, for a server to say its context window before it starts
without one (docs/ci.md, Settings)."""


@dataclass(frozen=True)
class Existing:
    """An existing session's log, read once: what a job resumes from."""

    folder: Path
    summary: LogSummary
    """What the log says (its rules checked, its state folded), no record held."""

    @property
    def state(self) -> SessionState:
        return self.summary.state


def read_existing(folder: Path) -> Existing:
    """The log of the session in ``folder``, read (not loaded: no lock, no repair) and folded,
    from its index where a valid one is there (docs/log-format.md, The index of a long log)."""
    try:
        summary = summarize(folder)
    except (LogCorrupted, LogFormatUnsupported) as e:
        raise ConfigError(f"cannot read the session log: {e}") from None
    return Existing(folder, summary)


def refuse_invalid(existing: Existing) -> None:
    """Refuse to continue a log that ``andon check`` rejects, unless crash repair (which the open
    of the log runs) makes it whole: a crash's open turn is fine, a broken history is not (it
    would stay broken for ever, whatever is appended after it)."""
    from andon.session import repair

    folder, summary = existing.folder, existing.summary
    if not summary.violations:
        return
    # What repair would append (a dry run: nothing written; SessionLive if the session is live).
    closers = repair(folder, dry_run=True).appended
    left = summary.check_with(closers)
    if left:
        first = left[0]
        raise ConfigError(
            f"cannot resume {folder}: its log breaks the log's rules (seq {first.seq}: "
            f"[{first.rule}] {first.message}) and repair cannot fix that; "
            f"'andon check {folder}' lists every violation"
        )


@dataclass(frozen=True)
class JobBase:
    """What ``run``, ``resume`` and ``chat`` resolve alike, before any process starts."""

    model: Model
    cwd: str | None
    system_prompt: str | None
    """andon's base text or the ``--system`` file's; the project instructions are added apart."""
    instructions: FoundInstructions | None
    since_seq: int
    """The first sequence number the job's events may carry (0 for a new session)."""


def job_base(settings: Settings, existing: Existing | None) -> JobBase:
    """The settings, and for an existing session what its log says where a setting is silent:
    its model, its base system prompt (as logged; the project instructions are read again, as
    they are now) and its working directory."""
    model_spec, system_prompt, cwd = settings.model, None, settings.cwd
    if existing is not None:
        state = existing.state
        if model_spec is None and state.model is not None:
            model_spec = state.model.spec
        system_prompt = state.base_system_prompt
        first = existing.summary.first.data if existing.summary.first is not None else None
        if cwd is None and isinstance(first, SessionStart):
            cwd = name_path(first.cwd)  # as show_name recorded it
    if settings.system is not None:
        system_prompt = read_system_prompt(settings.system)
    if cwd is not None and not Path(cwd).is_dir():
        raise ConfigError(f"--cwd: no such directory: {cwd}")
    model = load_model(model_spec, settings.thinking)
    # Checked before a session folder exists: a key file that cannot be read is a mistake of
    # the settings, and must leave nothing behind.
    remote_listen(settings.workers_in, settings.remote)
    instructions = project_instructions(settings, cwd)
    since_seq = existing.state.next_seq if existing is not None else 0
    return JobBase(model, cwd, system_prompt, instructions, since_seq)


def load_model(spec: str | None, thinking: bool | None) -> Model:
    if not spec:
        raise ConfigError(
            "no model: give --model SPEC (or ANDON_MODEL, or model = ... in andon.toml), e.g. "
            "--model deepseek-v4-flash or --model script:examples/ci-build/script.yaml"
        )
    return from_spec(spec, thinking=thinking)


def project_instructions(settings: Settings, cwd: str | None) -> FoundInstructions | None:
    """The AGENTS.md files of the working directory ``cwd`` (None: this process's), unless the
    settings turn them off; each file skipped is one warning line on stderr, and the run goes
    on without it (docs/agent-loop.md, Project instructions)."""
    if not settings.project_instructions:
        return None
    from andon.supervisor import find_project_instructions

    found = find_project_instructions(cwd if cwd is not None else os.getcwd())
    for warning in found.warnings:
        print(f"andon: warning: {warning}", file=sys.stderr, flush=True)
    return found


async def context_window_for(settings: Settings, model: Model) -> int | None:
    """The model's context window: the setting; else the window andon knows for the spec; else,
    for a server at a URL, what it says within :data:`DISCOVERY_TIMEOUT`; else ``None``."""
    if settings.context_window is not None:
        return settings.context_window
    known = known_context_window(model.info.spec)
    if known is not None:
        return known
    from andon.cli._structured import SchemaModel

    if isinstance(model, SchemaModel):  # --output-schema wraps the adapter that knows the URL
        model = model.inner
    if isinstance(model, Scripted):
        return None  # before the import below: a scripted run never loads the HTTP stack
    from andon.llm import OpenAICompatible, discover_context_window

    if not isinstance(model, OpenAICompatible) or model.info.provider == "openai":
        return None  # a script, a custom adapter, or OpenAI's API (it does not say)
    key_env = model.api_key_env
    found = await discover_context_window(
        model.base_url,
        timeout=DISCOVERY_TIMEOUT,
        model=model.info.name,
        api_key=(os.environ.get(key_env, "").strip() or None) if key_env else None,
    )
    _log.debug("context window of %s from the server: %s", model.info.spec, found)
    return found


def tool_registry(specs: tuple[str, ...]) -> ToolRegistry | None:
    """andon's built-in tools and the Python tools ``--tools`` names (None when it names none:
    the built-in ones). A clash of names is a user mistake, one line."""
    if not specs:
        return None
    from andon.workers import default, load_tools

    # Like ``python -m``: a module in the current directory is found first. Local workers start
    # with this process's sys.path, so they import it the same way.
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    registry = default()
    for spec in specs:
        for found in load_tools(spec, supervisor_tools=True):
            if found.name in registry:
                raise ConfigError(
                    f"--tools {spec!r}: a tool named {found.name!r} is already offered "
                    "(a built-in tool, or one of an earlier --tools)"
                )
            registry.add(found)
    return registry


def mcp_providers(settings: Settings) -> list[Any]:
    """The session's MCP servers as the provider ``open_agent`` takes (none: no provider). Each
    call of theirs is stopped on the session's grace timeline (docs/tools.md, MCP servers)."""
    if not settings.mcp_servers:
        return []
    try:
        import mcp  # noqa: F401  (the SDK: only the check that it is there)
    except ImportError:
        raise ConfigError(
            "MCP servers need the official MCP SDK, which is not installed: "
            "pip install 'andon[mcp]'"
        ) from None
    from andon.mcp import McpServerConfig, McpServers, ServerChoice

    grace = settings.grace
    return [
        McpServers(
            [
                ServerChoice(
                    McpServerConfig(
                        name=server.name,
                        command=server.argv,
                        env=dict(server.env),
                        cwd=server.cwd,
                        startup_timeout=server.startup_timeout,
                        term_after=grace.term_after,
                        kill_after=grace.kill_after,
                        # Closing its stdin is the polite request; the ladder follows it.
                        close_after=grace.term_after,
                    ),
                    enabled=server.enabled_tools,
                    disabled=server.disabled_tools,
                    tool_timeout=server.tool_timeout,
                )
                for server in settings.mcp_servers
            ]
        )
    ]


def agent_options(
    settings: Settings,
    *,
    model: Model,
    cwd: str | None,
    system_prompt: str | None,
    session_id: str | None,
    instructions: FoundInstructions | None = None,
    context_window: int | None = None,
) -> dict[str, Any]:
    """The ``open_agent`` options every CLI session takes from its settings (``andon run``,
    ``resume`` and ``chat``), so that one setting cannot reach one command and miss another."""
    import andon

    servers = len(settings.mcp_servers)
    listen = remote_listen(settings.workers_in, settings.remote)
    launcher = (
        remote_launcher(settings.workers_in, settings.remote, listen)
        if listen is not None
        else launcher_of(
            settings.workers_in, settings.containers, cwd, kubernetes=settings.kubernetes
        )
    )
    if settings.workers_in.startswith("pod:"):
        listen = pool_tcp(settings.kubernetes)  # Pods dial the pool where [kubernetes] says
    return {
        "model": model,
        "cwd": cwd,
        "pool": andon.WorkerPoolConfig(
            # Each MCP server holds a worker while it runs: the tools keep their own.
            size=settings.workers + servers,
            runtime_dir=runtime_root(),
            start_timeout=settings.worker_start_timeout or andon.WorkerPoolConfig.start_timeout,
            tcp=listen,
        ),
        "grace": settings.grace,
        "system_prompt": system_prompt,
        "tool_timeout": settings.tool_timeout,
        "pass_env": settings.pass_env,
        "session_id": session_id,
        "launcher": launcher,
        "project_instructions": instructions,
        "context_window": context_window,
        "tools": tool_registry(settings.tools),
        "providers": mcp_providers(settings),
        "max_parallel": settings.workers,
    }
