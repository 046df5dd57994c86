"""The reference MCP servers from npm for the tests: ``@modelcontextprotocol/server-everything``
and ``@modelcontextprotocol/server-filesystem``.

Each is installed once into a cache folder (``.ci/mcp-everything`` does it in CI; a test process
does it on first use, under a lock, if it is missing); where npm or the network is not there, the
tests that need it skip with the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

PACKAGE = "@modelcontextprotocol/server-everything"
FILESYSTEM = "@modelcontextprotocol/server-filesystem"
VERSION = "2026.8.31"
_INSTALL_TIMEOUT = 180.0


def cache_folder(package: str = PACKAGE) -> Path:
    """Where ``package`` is installed: the same place ``.ci/mcp-everything`` installs it."""
    base = os.environ.get("ANDON_CI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "andon-ci"
    )
    return Path(base) / "npm" / f"{package.rsplit('/', 1)[-1]}-{VERSION}"


def _entry(folder: Path, package: str) -> Path:
    return folder / "node_modules" / package / "dist" / "index.js"


def _installed(package: str) -> tuple[str, str] | str:
    """(node, the package's entry script), or why it cannot be had here."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        return "node and npm are not installed"
    folder = cache_folder(package)
    entry = _entry(folder, package)
    if not entry.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing it
                if not entry.exists():
                    argv = [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund"]
                    done = subprocess.run(
                        [*argv, "--loglevel=error", f"{package}@{VERSION}"],
                        capture_output=True,
                        text=True,
                        timeout=_INSTALL_TIMEOUT,
                        stdin=subprocess.DEVNULL,
                    )
                    if done.returncode != 0:
                        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                        return f"npm install {package}@{VERSION} failed: {last[:200]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"npm install {package}@{VERSION} failed: {e}"
    if not entry.exists():
        return f"npm installed {package}@{VERSION} without {entry.name}"
    return node, str(entry)


def command() -> tuple[str, ...] | str:
    """server-everything's argv, or why it cannot be had here."""
    found = _installed(PACKAGE)
    return found if isinstance(found, str) else (*found, "stdio")


def filesystem_command(root: str) -> tuple[str, ...] | str:
    """server-filesystem's argv, allowed ``root`` only, or why it cannot be had here."""
    found = _installed(FILESYSTEM)
    return found if isinstance(found, str) else (*found, root)
