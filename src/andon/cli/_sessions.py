"""Where the CLI keeps what outlives a run: the sessions root, a new session's folder under it,
and the worker pool's runtime folder. All of it outside the workspace, on purpose: tools run
there, and a ``git clean -fdx`` or ``rm -rf .andon`` must not delete a live log or the pool's
socket."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from andon.base import ConfigError, session_id

__all__ = ["new_session_dir", "runtime_root", "sessions_root"]


def sessions_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where new sessions go without ``--session``: ``$ANDON_HOME/sessions``, by default
    ``${XDG_STATE_HOME:-~/.local/state}/andon/sessions``. Outside the workspace on purpose: tools
    run there, and a ``git clean -fdx`` or ``rm -rf .andon`` must not delete a live log."""
    env = os.environ if environ is None else environ
    home = env.get("ANDON_HOME", "")
    if home:
        return Path(home).expanduser().absolute() / "sessions"
    state = env.get("XDG_STATE_HOME", "")
    if not state or not os.path.isabs(state):  # the XDG spec: a relative path is ignored
        state = os.path.join(_home(env), ".local", "state")
    return Path(state) / "andon" / "sessions"


def _home(env: Mapping[str, str]) -> str:
    """``$HOME``, which must be an absolute path other than ``/``. Unset or empty, Python's
    ``expanduser`` would give ``/`` (or the password database's entry, often ``/`` or a folder that
    does not exist for a service user), and the sessions would land in ``/.local/state``: a
    place nobody looks, shared by every such job. An error that says what to set instead."""
    home = env.get("HOME", "")
    if not home or not os.path.isabs(home) or home.strip("/") == "":
        shown = "not set" if "HOME" not in env else f"{home!r}"
        raise ConfigError(
            f"HOME is {shown}, so andon has no sessions folder: set ANDON_HOME (or an absolute "
            "XDG_STATE_HOME), or give --session DIR"
        )
    return home


def runtime_root(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the worker pool keeps its private socket folder: ``$XDG_RUNTIME_DIR`` if it is a
    folder, else ``run/`` beside the sessions root (created 0700). Never ``/tmp`` by default: a
    tool's ``rm -rf /tmp/*`` (a common CI clean-up) would delete the socket, and no replacement
    worker could reach the pool again. ``None`` (the pool's own fallback) if it cannot be made, or
    if there is no sessions root (``HOME`` unset or empty, no ``ANDON_HOME``)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return xdg
    try:
        run = sessions_root(env).parent / "run"
    except ConfigError:
        return None  # no home to put it beside (a run with --session DIR needs none)
    try:
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return str(run)


def new_session_dir() -> Path:
    """A new session's folder under the root (the root is created with its parents, 0700), named
    by a fresh session id: pass ``session_id=path.name`` to ``open_agent`` so that its
    ``session/start`` records the same id."""
    root = sessions_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create the sessions folder {root}: {e.strerror or e} (set ANDON_HOME, or "
            "give --session DIR)"
        ) from None
    return root / session_id()
