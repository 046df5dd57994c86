"""``andon.open_agent``: wire a session log, a worker pool, the executor and a model into an
Agent, and take it all down again (leaving no process behind) when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

from andon.base import (
    Clock,
    ConfigError,
    GracePolicy,
    SystemClock,
    __version__,
    check_session_id,
    show_name,
)
from andon.base import session_id as new_session_id
from andon.fleet import WorkerLauncher, WorkerPool, WorkerPoolConfig
from andon.llm import API_KEY_ENV_VARS, Model
from andon.session import (
    FORMAT_VERSION,
    EventData,
    ModelInfo,
    Record,
    SessionLog,
    SessionResumed,
    SessionStart,
)
from andon.supervisor._agent import Agent, check_context_window, check_max_parallel
from andon.supervisor._executor import ToolExecutor
from andon.supervisor._hooks import HookSpec
from andon.supervisor._instructions import FoundInstructions
from andon.supervisor._providers import ToolProvider
from andon.workers import ToolRegistry, default

__all__ = ["DEFAULT_SYSTEM_PROMPT", "SECRET_ENV", "open_agent"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful software agent working in a developer's or a CI machine's working "
    "directory. Use the tools to inspect files and run commands; prefer small, verifiable steps; "
    "report what you did and what you observed. A tool result may say a call was stopped, timed "
    "out, or that its outcome is unknown after a crash: do not assume it succeeded, and never "
    "retry a call with side effects blindly."
)

# Model API keys never reach a tool's environment, nor that of any process andon starts (a tool
# can read its worker's /proc/<pid>/environ): the pool starts its workers without them. The names
# are declared once, in andon.base: a key variable added for a new provider is hidden from the
# tools by the same change.
SECRET_ENV: Final[tuple[str, ...]] = tuple(sorted(API_KEY_ENV_VARS))


def _check_logged_session_id(loaded: Sequence[Record]) -> None:
    """A session whose recorded id cannot name its calls' processes (written by an andon that
    did not check it) is refused before anything is appended: every call would fail."""
    for record in loaded:
        if isinstance(record.data, SessionStart):
            try:
                check_session_id(record.data.session_id)
            except ConfigError as e:
                raise ConfigError(f"cannot resume this session: {e}") from None
            return


async def _open_providers(
    stack: contextlib.AsyncExitStack,
    providers: Sequence[ToolProvider],
    workers: WorkerPool,
    registry: ToolRegistry,
    owner: str,
    write: Callable[[EventData], object],
) -> ToolRegistry:
    """Open each provider on the stack (closed in reverse, before the pool) and return the
    registry with their tools added; a name offered twice is a ``ConfigError``."""
    if not providers:
        return registry
    for provider in providers:
        missing = [t.name for t in provider.worker_tools if t.name not in workers.registry]
        if missing:
            raise ConfigError(
                f"the worker pool lacks the tools a provider needs ({', '.join(missing)}); "
                "let open_agent start the pool, or start it with them"
            )
    offered = list(registry)
    for provider in providers:
        for tool in await stack.enter_async_context(provider.open(workers, owner, write)):
            if tool.name in {t.name for t in offered}:
                raise ConfigError(f"the tool name {tool.name!r} is offered twice")
            offered.append(tool)
    return ToolRegistry(offered)


def _secret_names(model: Model, secret_env: Sequence[str]) -> tuple[str, ...]:
    """andon's key variables, the caller's ``secret_env``, and the variable the model in use
    reads its key from (a custom adapter's ``api_key_env``), each once."""
    key_env = getattr(model, "api_key_env", None)
    own = (key_env,) if isinstance(key_env, str) and key_env else ()
    return tuple(dict.fromkeys((*SECRET_ENV, *secret_env, *own)))


@asynccontextmanager
async def open_agent(
    session_dir: str | os.PathLike[str],
    *,
    model: Model,
    cwd: str | os.PathLike[str] | None = None,
    tools: ToolRegistry | None = None,
    pool: WorkerPoolConfig | None = None,
    grace: GracePolicy | None = None,
    hooks: Sequence[HookSpec] = (),
    system_prompt: str | None = None,
    clock: Clock | None = None,
    durability: str = "barrier",
    tool_timeout: float | None = None,
    max_tool_timeout: float | None = None,
    max_parallel: int | None = None,
    secret_env: Sequence[str] = (),
    pass_env: Sequence[str] = (),
    workers: WorkerPool | None = None,
    session_id: str | None = None,
    launcher: WorkerLauncher | None = None,
    context_window: int | None = None,
    project_instructions: FoundInstructions | None = None,
    providers: Sequence[ToolProvider] = (),
) -> AsyncIterator[Agent]:
    """Open (or resume) the session in ``session_dir`` and yield its :class:`Agent`.

    Leaving the block disposes the agent: ``cancel(Disposed())`` (the inbox is cleared durably),
    wait until idle, stop the worker pool (no process is left behind), close the log. With
    ``workers``, an already running pool is used (several sessions of one process may share one)
    and is left running.

    The block owns an ``asyncio.TaskGroup``: every task the agent starts (its turn driver, and
    through it the step's tool calls and subagents) is a child of it and has ended when the block
    ends.

    ``launcher`` starts the pool's workers somewhere else than as local forks (a
    :class:`ContainerLauncher`, a :class:`CommandLauncher`); ignored with ``workers``.

    ``context_window`` is the model's context window in tokens (None: unknown); requests are
    kept within it by compaction (docs/agent-loop.md, Compaction).

    ``session_id`` is the id a new session's ``session/start`` records (default: a fresh one); the
    CLI names the session folder after it. It is ignored when an existing session is resumed.

    ``project_instructions`` (from :func:`find_project_instructions`) are added after the system
    prompt (``system_prompt``, or andon's own), and ``session/start`` or ``session/resumed``
    records which files they came from (docs/agent-loop.md, Project instructions).

    ``providers`` add tools from elsewhere (the MCP servers of ``andon.mcp``): each is opened
    once the pool runs, its tools join ``tools`` (a name offered twice is refused), and it is
    closed after the agent is disposed, before the pool stops.
    """
    check_context_window(context_window)  # before anything is opened: a bad value loses nothing
    if max_parallel is not None:
        check_max_parallel(max_parallel)  # before anything is opened: a bad value loses nothing
    if session_id is not None:
        check_session_id(session_id)  # the same: it would name every call's processes
    clock = clock or SystemClock()
    registry = tools if tools is not None else default()
    pool_config = pool or WorkerPoolConfig()
    workdir = str(Path(cwd).resolve()) if cwd is not None else os.getcwd()
    prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
    added = project_instructions.record if project_instructions is not None else None
    if project_instructions is not None:
        prompt = project_instructions.add_to(prompt)
    # Only the records the history needs are read: a long session that compacts resumes in time
    # set by its compaction period, not its length (andon.session._history_start).
    log = SessionLog.open(session_dir, durability=durability, clock=clock, keep="history")  # type: ignore[arg-type]
    try:
        loaded = log.loaded.events
        info = model.info
        record_model = ModelInfo(info.spec, info.provider, info.name)
        if loaded:
            _check_logged_session_id(loaded)
            state = log.loaded.state
            first = log.append(
                SessionResumed(
                    os.getpid(),
                    socket.gethostname(),
                    __version__,
                    record_model,
                    prompt,
                    log.loaded.repaired,
                    added,
                )
            )
            next_turn, next_step = state.next_turn, state.next_step
        else:
            first = log.append(
                SessionStart(
                    FORMAT_VERSION,
                    session_id if session_id is not None else new_session_id(),
                    __version__,
                    clock.time(),
                    show_name(workdir),  # a path of any bytes, spelled as the file tools spell it
                    record_model,
                    prompt,
                    os.getpid(),
                    socket.gethostname(),
                    added,
                )
            )
            next_turn, next_step = (), ()
        await log.barrier()
        # No worker holds a secret, even one passed on purpose: a ``pass_env`` secret reaches
        # only the tools, through each call's environment additions (from this process's own
        # environment), never the workers' environment.
        secrets = _secret_names(model, secret_env)
        hidden = tuple(name for name in secrets if name not in pass_env)
        passed = {n: os.environ[n] for n in secrets if n in pass_env and n in os.environ}
        async with contextlib.AsyncExitStack() as stack:
            hidden_tools = [t for p in providers for t in p.worker_tools]
            if workers is None:
                pool_registry = (
                    ToolRegistry([*registry, *hidden_tools]) if hidden_tools else registry
                )
                workers = await stack.enter_async_context(
                    WorkerPool(pool_config, pool_registry, hide_env=secrets, launcher=launcher)
                )
            else:
                workers.hide_env(secrets)  # refuses if its workers already hold one of them
            owner = next(
                (r.data.session_id for r in (*loaded, first) if isinstance(r.data, SessionStart)),
                "",
            )
            registry = await _open_providers(
                stack, providers, workers, registry, owner, lambda d: log.append(d, ignorable=True)
            )
            executor = ToolExecutor(
                workers,
                registry,
                grace=grace,
                clock=clock,
                default_timeout=tool_timeout,
                max_timeout=max_tool_timeout,
                session_dir=log.session_dir,
                env_add={**passed, "ANDON_SESSION": str(log.session_dir)},
                env_remove=hidden,
            )
            tasks = await stack.enter_async_context(asyncio.TaskGroup())
            agent = Agent(
                log=log,
                model=model,
                executor=executor,
                registry=registry,
                records=[*loaded, first],
                from_cut=log.loaded.cut is not None,
                system_prompt=prompt,
                cwd=workdir,
                tasks=tasks,
                hooks=hooks,
                max_parallel=max_parallel if max_parallel is not None else pool_config.size,
                clock=clock,
                next_turn=next_turn,
                next_step=next_step,
                context_window=context_window,
            )
            # The caller's own exception must leave this block as it came in: a TaskGroup would
            # wrap it in an ExceptionGroup, so it is held across the group's exit, then re-raised.
            held: BaseException | None = None
            try:
                yield agent
            except BaseException as e:
                held = e
            finally:
                await agent.aclose()
            if held is not None:
                await stack.aclose()  # the group (every task has ended), then the pool
                raise held
    finally:
        await log.aclose()
