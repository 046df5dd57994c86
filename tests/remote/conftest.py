"""Two "hosts" on one machine: this process's network namespace and a new one, joined by a veth
pair (docs/scale-out.md, What is tested, and how). Needs root and iproute2; without them the tests
skip and say why. Every name (namespace, interfaces) carries a random part, and the address pair is
picked at random in 10.200-254.x.x, so another copy of the suite on the machine never meets
these."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from andon.fleet import PoolObserver


@dataclass(frozen=True)
class Hosts:
    namespace: str  # the workers' network namespace
    local_link: str  # our end of the veth pair
    local_address: str  # the supervisor's address, seen from the workers
    remote_address: str

    def run_there(self) -> list[str]:
        """The prefix that runs a command in the workers' namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def link(self, state: str) -> None:
        _ip("link", "set", self.local_link, state)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"andon-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, timeout=30)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.decode(errors='replace').strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    return None


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    namespace, local, remote = f"andon-w-{tag}", f"anl{tag}", f"anr{tag}"
    rng = random.SystemRandom()
    base = f"10.{rng.randint(200, 254)}.{rng.randint(0, 255)}.{rng.randint(0, 63) * 4}"
    prefix = base.rsplit(".", 1)[0]
    last = int(base.rsplit(".", 1)[1])
    ours, theirs = f"{prefix}.{last + 1}", f"{prefix}.{last + 2}"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", local, "type", "veth", "peer", "name", remote)
        _ip("link", "set", remote, "netns", namespace)
        _ip("addr", "add", f"{ours}/30", "dev", local)
        _ip("link", "set", local, "up")
        there = ["-n", namespace]
        _ip(*there, "addr", "add", f"{theirs}/30", "dev", remote)
        _ip(*there, "link", "set", remote, "up")
        _ip(*there, "link", "set", "lo", "up")
        yield Hosts(namespace, local, ours, theirs)
    finally:
        subprocess.run(["ip", "link", "delete", local], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30)


class Refusals(PoolObserver):
    """Puts each refusal the pool reports on ``queue`` (a test waits on it, never sleeps)."""

    def __init__(self, queue: asyncio.Queue[str]) -> None:
        self.queue = queue

    def on_refused(self, reason: str) -> None:
        self.queue.put_nowait(reason)


@dataclass(frozen=True)
class SshHost:
    """A real OpenSSH server in the workers' namespace, reachable as ``destination`` with the
    ``ssh`` command line (its own key, known-hosts file and no user configuration)."""

    destination: str
    ssh: list[str]


def _why_no_sshd() -> str | None:
    if shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        return "OpenSSH's server is not installed (.ci/run installs openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "OpenSSH's client is not installed"
    return None


@pytest.fixture
def ssh_host(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    reason = _why_no_sshd()
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    config = folder / "sshd_config"
    config.write_text(
        f"ListenAddress {hosts.remote_address}\n"
        f"HostKey {folder / 'host_key'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        f"PidFile {folder / 'sshd.pid'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n"
    )
    # OpenSSH's privilege separation needs this folder (made empty, as its package would).
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    sshd = shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert sshd is not None
    with open(folder / "sshd.log", "wb") as log:
        server = subprocess.Popen(
            [*hosts.run_there(), sshd, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    ssh = [
        "ssh",
        "-F",
        "none",
        "-i",
        str(folder / "client_key"),
        "-o",
        f"UserKnownHostsFile={folder / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=30",
        "-T",
    ]
    destination = f"root@{hosts.remote_address}"
    try:
        # Ready once a command runs through it (bounded: ConnectTimeout, a few tries while sshd
        # binds; the first refused connection comes back at once).
        for _ in range(50):
            done = subprocess.run(
                [*ssh, destination, "true"],
                capture_output=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode == 0:
                break
            if server.poll() is not None:
                raise AssertionError((folder / "sshd.log").read_text())
            time.sleep(0.1)  # sleep-ok: sshd binds its port; a bounded retry, not an ordering
        else:
            raise AssertionError(f"sshd never answered: {done.stderr!r}")
        yield SshHost(destination, ssh)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
