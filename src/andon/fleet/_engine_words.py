"""What the launcher and the check before a run (``_engine_check``) share about an engine: how one
that does not answer is named to a user (the address tried, how to start one), and the API
version an engine at an address gave earlier in this process."""

from __future__ import annotations

import os
from typing import Final

__all__ = ["API_VERSIONS", "engine_address", "engine_unreachable"]

_DEFAULT_SOCKET: Final = "unix:///var/run/docker.sock"

API_VERSIONS: Final[dict[str, str]] = {}
"""address -> the API version its engine answered (the check before a run asks it): the
launcher's client then skips docker-py's own version request, which Podman answers slowly
(~0.5 s: it asks conmon and the runtime for theirs)."""


def engine_address(base_url: str | None) -> str:
    """The address a launcher's client dials: its ``base_url``, else ``$DOCKER_HOST``, else
    Docker's default socket (what ``docker.from_env`` tries)."""
    return base_url or os.environ.get("DOCKER_HOST") or _DEFAULT_SOCKET


def engine_unreachable(address: str, error: BaseException | str) -> str:
    """One line: why the engine at ``address`` did not answer, and how to start one."""
    text = str(error)
    if "FileNotFoundError" in text or "No such file" in text:
        why = "no such socket"
    elif "ConnectionRefused" in text or "Connection refused" in text:
        why = "nothing listens on the socket"
    elif "PermissionError" in text or "Permission denied" in text:
        why = "no permission to use the socket"
    elif any(w in text for w in ("Connection aborted", "Connection reset", "RemoteDisconnected")):
        # A socket-activated service that fails to start (Podman whose default runtime, crun
        # say, is not installed) takes the connection and closes it without a word.
        why = (
            "it took the connection and closed it: its service failed to start? see "
            "`systemctl status podman.service`; Podman stops at once when its default runtime "
            "is not installed: install it, or start it as `podman --runtime runc system service`"
        )
    else:
        why = " ".join(text.split())[:400]
    fix = "start it or point andon.toml's [containers] engine at the engine you run"
    if address.startswith("unix://"):
        fix = (
            f"start the engine (`systemctl start podman.socket`, or `podman system service "
            f"--time=0 {address} &`), or set [containers] engine in andon.toml to its socket"
        )
    return f"no container engine answers at {address} ({why}): {fix}"
