"""Settings of ``andon run`` / ``andon resume``: flags win over ``ANDON_*`` variables, which win
over ``andon.toml`` in the working directory (docs/ci.md, Settings).

``andon.toml`` alone may also hold ``[prices."MODEL"]`` tables (``andon.cli._prices``): the prices
the run's ``cost`` is computed with, beside or instead of the built-in ones.

Only the names below are read from the environment: ``ANDON_SESSION`` (set for every tool call) and
``ANDON_API_KEY`` (a model key) are deliberately not settings, so an ``andon run`` started by a tool
never resumes its parent's session by accident.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from andon.base import ConfigError, GracePolicy, UnreadableFile, clean_text, read_small_file
from andon.cli._kubernetes import KUBERNETES, KubernetesSettings, parse_kubernetes
from andon.cli._mcp_config import (
    MCP,
    McpServerSettings,
    merge_servers,
    parse_mcp_flag,
    parse_mcp_json,
    parse_mcp_table,
)
from andon.cli._prices import Price, parse_prices
from andon.cli._remote import REMOTE, RemoteSettings, parse_remote
from andon.cli._workers import CONTAINERS, ContainerSettings, parse_containers, workers_in

__all__ = [
    "ENV_VARS",
    "MAX_GRACE",
    "TOML_FILE",
    "Settings",
    "max_workers",
    "read_system_prompt",
    "resolve",
]

TOML_FILE: Final = "andon.toml"


@dataclass(frozen=True)
class Settings:
    model: str | None = None
    cwd: str | None = None
    system: str | None = None  # a file holding the system prompt
    workers: int = 4
    grace: GracePolicy = field(default_factory=GracePolicy)
    tool_timeout: float | None = None
    worker_start_timeout: float | None = None  # None: the pool's default
    turn_budget: float | None = None
    max_steps: int | None = None
    context_window: int | None = None  # tokens; None: known for the spec, or asked of the server
    pass_env: tuple[str, ...] = ()
    thinking: bool | None = None
    workers_in: str = "local"  # or "container:IMAGE", "pod:IMAGE"
    progress_interval: float = 30.0  # liveness lines outside a terminal; 0: none
    prices: Mapping[str, Price] = field(default_factory=dict)  # andon.toml only: model -> price
    containers: ContainerSettings = field(default_factory=ContainerSettings)  # andon.toml only
    remote: RemoteSettings = field(default_factory=RemoteSettings)  # andon.toml only
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)  # andon.toml only
    project_instructions: bool = True  # AGENTS.md from the git root down to the cwd
    tools: tuple[str, ...] = ()  # MODULE:NAME of Python tools offered beside the built-in ones
    # The MCP servers the session starts: andon.toml's [mcp.servers.NAME], --mcp-config's file,
    # then --mcp flags (a later one wins for the same name).
    mcp_servers: tuple[McpServerSettings, ...] = ()


def _positive_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{name} takes a number of seconds (got {text!r})") from None
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a finite, positive number of seconds (got {text!r})")
        return value

    return parse


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{name} takes a whole number (got {text!r})") from None
        if value < 1:
            raise ConfigError(f"{name} must be at least 1 (got {text!r})")
        return value

    return parse


MAX_CONTEXT_WINDOW: Final = 1 << 31
"""The largest ``context_window`` accepted, in tokens: the largest windows are a few million."""


def _context_window(text: str) -> int:
    value = _positive_int("context-window")(text)
    if value >= MAX_CONTEXT_WINDOW:
        raise ConfigError(
            f"context-window must be below {MAX_CONTEXT_WINDOW} tokens (got {text!r})"
        )
    return value


def _interval(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{name} takes a number of seconds (got {text!r})") from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{name} must be a finite number of seconds, 0 to turn it off (got {text!r})"
            )
        return value

    return parse


MAX_GRACE: Final = 3600.0
"""The longest a grace stage may be, in seconds (each of TERM and KILL)."""


def max_workers() -> int:
    """``--workers`` at most: four per CPU."""
    return 4 * (os.cpu_count() or 1)


def _workers(text: str) -> int:
    value = _positive_int("workers")(text)
    if value > max_workers():
        raise ConfigError(f"workers must be at most {max_workers()} (4 per CPU; got {text!r})")
    return value


def _grace(text: str) -> GracePolicy:
    # GracePolicy.parse words its own errors for the user ("--grace: TERM must be ..."); the
    # caller adds where a variable or andon.toml gave the text.
    try:
        policy = GracePolicy.parse(text)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None
    for label, stage in (("TERM", policy.term_after), ("KILL", policy.kill_after)):
        if not math.isfinite(stage) or not 0 <= stage <= MAX_GRACE:
            raise ConfigError(
                f"--grace: {label} must be a number of seconds from 0 to {MAX_GRACE:g} "
                f"(got {text.split(',')[0 if label == 'TERM' else 1].strip()})"
            )
    return policy


def _switch(name: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        value = text.strip().lower()
        if value in ("on", "true", "1", "yes"):
            return True
        if value in ("off", "false", "0", "no"):
            return False
        raise ConfigError(f"{name} takes on or off (got {text!r})")

    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _tool_specs(text: str) -> tuple[str, ...]:
    specs = _names(text)
    for spec in specs:
        module, sep, name = spec.partition(":")
        if not sep or not module or not name:
            raise ConfigError(f"tools takes MODULE:NAME (a module of Python tools), not {spec!r}")
    return specs


_PARSERS: Final[dict[str, Callable[[str], Any]]] = {
    "model": str.strip,
    "cwd": str,
    "system": str,
    "workers": _workers,
    "grace": _grace,
    "tool_timeout": _positive_float("tool-timeout"),
    "worker_start_timeout": _positive_float("worker-start-timeout"),
    "turn_budget": _positive_float("turn-budget"),
    "max_steps": _positive_int("max-steps"),
    "context_window": _context_window,
    "pass_env": _names,
    "thinking": _switch("thinking"),
    "project_instructions": _switch("project-instructions"),
    "workers_in": workers_in,
    "progress_interval": _interval("progress-interval"),
    "tools": _tool_specs,
    "mcp_config": lambda text: parse_mcp_json(Path(text)),
}

ENV_VARS: Final = {name: f"ANDON_{name.upper()}" for name in _PARSERS}
"""setting -> environment variable (``ANDON_MODEL``, ``ANDON_GRACE`` ...)."""


MAX_TOML_BYTES: Final = 1 << 20
"""The largest ``andon.toml`` read: a settings file is a few lines; anything bigger is a mistake."""


def _toml_bytes(path: Path) -> bytes | None:
    """The bytes of ``path``, or None if there is no such file (read the one safe way:
    ``andon.base.read_small_file``)."""
    try:
        found = read_small_file(path, MAX_TOML_BYTES)
    except FileNotFoundError:
        return None
    except UnreadableFile as e:
        reason = "is a folder, not a settings file" if "folder" in e.reason else e.reason
        raise ConfigError(f"{path}: {reason}") from None
    if found.over(MAX_TOML_BYTES):
        raise ConfigError(f"{path}: larger than {MAX_TOML_BYTES} bytes; not a settings file")
    return found.data


def _toml_table(path: Path, data: bytes) -> dict[str, Any]:
    """Parse the file's bytes; every way it can be wrong is one ``ConfigError`` line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})"
        ) from None
    import tomllib  # only where an andon.toml exists (it brings datetime along)

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message ends "(at line L, column C)"
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as e:  # an integer beyond Python's digit limit (its advice is for coders)
        reason = str(e).split(";")[0]
        raise ConfigError(f"{path}: not valid TOML: a number it cannot read ({reason})") from None


_PRICES: Final = "prices"
"""The one table of ``andon.toml`` that is not a setting of a flag or a variable."""


def _from_toml(folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """The settings of ``andon.toml`` (as text, parsed like a variable) and its tables (prices,
    containers), parsed."""
    path = folder / TOML_FILE
    data = _toml_bytes(path)
    if data is None:
        return {}, {}
    table = _toml_table(path, data)
    out: dict[str, str] = {}
    tables: dict[str, Any] = {}
    for key, value in table.items():
        if key == _PRICES:
            tables["prices"] = parse_prices(value, path)
            continue
        if key == CONTAINERS:
            tables["containers"] = parse_containers(value, path)
            continue
        if key == REMOTE:
            tables["remote"] = parse_remote(value, path)
            continue
        if key == MCP:
            tables["mcp_servers"] = parse_mcp_table(value, path)
            continue
        if key == KUBERNETES:
            tables["kubernetes"] = parse_kubernetes(value, path)
            continue
        name = key.replace("-", "_")
        if name not in _PARSERS:
            known = ", ".join(sorted([*_PARSERS, _PRICES, CONTAINERS, REMOTE, MCP, KUBERNETES]))
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "on" if value else "off"
        elif not isinstance(value, str | int | float):
            raise ConfigError(f"{path}: setting {key!r} must be a string, number or list")
        out[name] = str(value)
    return out, tables


def resolve(flags: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Settings:
    """Merge ``andon.toml`` (in the current directory), ``ANDON_*`` variables and ``flags``
    (a flag left at ``None``, or an empty list, is unset)."""
    environ = os.environ if env is None else env
    raw, tables = _from_toml(Path.cwd())
    for name, var in ENV_VARS.items():
        if environ.get(var):
            raw[name] = environ[var]
    values: dict[str, Any] = dict(tables)
    for name, text in raw.items():
        try:
            values[name] = _PARSERS[name](text)
        except ConfigError as e:
            where = ENV_VARS[name] if environ.get(ENV_VARS[name]) == text else TOML_FILE
            raise ConfigError(f"{e} (from {where})") from None
    for name in _PARSERS:
        value = flags.get(name)
        if value is None or value == []:
            continue
        if name == "pass_env":
            values[name] = tuple(n for item in value for n in _names(item))
        elif name == "tools":
            values[name] = tuple(n for item in value for n in _tool_specs(item))
        elif isinstance(value, str):
            values[name] = _PARSERS[name](value)
        else:
            values[name] = value
    flagged = tuple(parse_mcp_flag(text) for text in flags.get("mcp") or ())
    values["mcp_servers"] = merge_servers(
        values.get("mcp_servers", ()), values.pop("mcp_config", ()), flagged
    )
    return Settings(**values)


def add_agent_options(p: argparse.ArgumentParser, *, job: bool) -> None:
    """The options every agent command shares (``run``, ``resume``, ``chat``); ``job`` adds those
    of a one-shot job. ``None`` means "not given", so andon.toml and ANDON_* apply."""
    p.add_argument("--model", metavar="SPEC", help="deepseek-v4-flash, openai:M, URL#M, script:F")
    p.add_argument("--cwd", metavar="DIR", help="working directory of the tools")
    p.add_argument(
        "--system",
        metavar="FILE",
        help="file holding the system prompt (replaces andon's own; AGENTS.md is still added)",
    )
    p.add_argument(
        "--no-project-instructions",
        dest="project_instructions",
        action="store_const",
        const=False,
        default=None,
        help="do not add the AGENTS.md files from the git root down to the working directory",
    )
    if job:
        p.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    p.add_argument(
        "--workers",
        metavar="N",
        help="tool worker processes, started as calls need them (default 4)",
    )
    p.add_argument("--grace", metavar="TERM,KILL", help="seconds to SIGTERM, then to SIGKILL")
    p.add_argument(
        "--mcp",
        action="append",
        metavar="'NAME=COMMAND ARGS…'",
        help="an MCP server (stdio) whose tools the model gets as NAME__TOOL; repeatable",
    )
    p.add_argument(
        "--mcp-config",
        metavar="FILE",
        help='MCP servers from a {"mcpServers": {...}} JSON file, as other agent tools read',
    )
    p.add_argument(
        "--tools",
        action="append",
        metavar="MODULE:NAME",
        help="Python tools to offer beside the built-in ones: a ToolRegistry, a list of tools or "
        "one tool in an importable module (the current directory first); repeatable",
    )
    p.add_argument(
        "--tool-timeout",
        metavar="S",
        help="default timeout of every tool call, bash included; raises bash's cap to at least S",
    )
    p.add_argument(
        "--worker-start-timeout",
        metavar="SECONDS",
        help="how long one tool worker may take to start before it is tried again (default 60)",
    )
    if job:
        p.add_argument(
            "--turn-budget", metavar="SECONDS", help="stop a turn after this long (exit 5)"
        )
        p.add_argument(
            "--max-steps", metavar="N", help="stop a turn after this many steps (exit 5)"
        )
        p.add_argument(
            "-o",
            "--output-last-message",
            metavar="FILE",
            help="write the final answer to FILE when the run exits 0 (atomically; on any other "
            "exit FILE is left as it was)",
        )
        p.add_argument(
            "--output-schema",
            metavar="FILE",
            help="a JSON Schema the final answer must match (JSON; one retry, then exit 8); the "
            "value is run/summary's output",
        )
        p.add_argument(
            "--progress-interval",
            metavar="S",
            help="outside a terminal: say every S seconds that a silent tool or a slow start is "
            "still going (default 30; 0: never)",
        )
    p.add_argument(
        "--context-window",
        metavar="N",
        help="the model's context window in tokens (default: known for the model, or asked of "
        "the server)",
    )
    p.add_argument(
        "--pass-env",
        metavar="NAME",
        action="append",
        default=[],
        help="let a model key variable reach the tools (repeatable)",
    )
    p.add_argument("--thinking", choices=("on", "off"), help="DeepSeek thinking (default on)")
    p.add_argument(
        "--workers-in",
        metavar="WHERE",
        help="where tools run: local (default), container:IMAGE ([containers] in andon.toml), "
        "pod:IMAGE ([kubernetes]), ssh:HOST or tcp:ADDRESS ([remote])",
    )


def read_system_prompt(path: str) -> str:
    """The text of a ``--system`` file, made valid Unicode by andon's rule (a Latin-1 byte is
    U+FFFD, docs/log-format.md, Text); ``ConfigError`` naming the file if it cannot be read."""
    try:
        return clean_text(Path(path).read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read the system prompt file {path}: {e}") from None
