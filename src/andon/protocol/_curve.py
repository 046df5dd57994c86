"""ZeroMQ CURVE for workers on other hosts: key files, socket options, and a ZAP allow-list.

The supervisor's ROUTER is a CURVE server (:func:`curve_server`); a remote worker's DEALER is a
CURVE client that knows the server's public key (:func:`curve_client`). CURVE by itself only
encrypts: a client with *any* key pair gets in. Who may connect is decided by a ZAP handler
(RFC 27) bound at ``inproc://zeromq.zap.01`` in the ROUTER's context: :class:`ZapAllowList`
answers 200 only for a public key on its list.

Fail closed. libzmq admits every CURVE client when no ZAP handler is bound at handshake time, so
a handler that was never started, or was closed while the ROUTER still listens, would silently
open the door. :func:`curve_server` sets ``ZAP_ENFORCE_DOMAIN``, which turns "no handler" into a
failed handshake instead.

What libzmq (4.3.5) does with a refused peer, as the tests observe it:

* a CURVE client whose key is refused gets an ERROR command; both ends see
  ``HANDSHAKE_FAILED_AUTH`` (value 400), and the client does **not** reconnect: what it had queued
  is dropped, and it must disconnect and connect again (a worker exits and is started again).
* a client without CURVE never reaches ZAP: the greetings' mechanisms differ, both ends see
  ``HANDSHAKE_FAILED_PROTOCOL`` (``ZMTP_MECHANISM_MISMATCH``), the server drops the connection
  and the client does not retry. ``on_refused`` is not called for it.

Key files use pyzmq's (czmq's) certificate format, so ``zmq.auth.load_certificate`` reads them
too: ``<name>.key`` holds the public key, ``<name>.key_secret`` both keys (mode 0600).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import struct
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import zmq
import zmq.asyncio
from zmq.utils import z85

from andon.base import ConfigError, clean_text

__all__ = [
    "CurveKeys",
    "ZapAllowList",
    "curve_client",
    "curve_server",
    "is_loopback",
    "key_from_text",
    "key_to_hex",
    "load_keys",
    "load_public_keys",
    "write_keys",
]

_log = logging.getLogger("andon.zap")

_ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"  # fixed by RFC 27
_ZAP_DOMAIN: Final = b"andon"
_ZAP_VERSION: Final = b"1.0"
_KEY_LENGTH: Final = 40  # Z85 of a 32-byte key
_RAW_KEY_LENGTH: Final = 32
_Z85_CHARS: Final = frozenset(z85.Z85CHARS)


# --- keys -------------------------------------------------------------------------------------


def _key_problem(key: object) -> str | None:
    """Why ``key`` is not a Z85 CURVE key, or None when it is one."""
    if not isinstance(key, bytes):
        return f"a key must be bytes, not {type(key).__name__}"
    if len(key) != _KEY_LENGTH:
        return f"a CURVE key is {_KEY_LENGTH} Z85 characters, this one has {len(key)}"
    if not _Z85_CHARS.issuperset(key):
        return "a CURVE key is Z85 text, this one has other characters"
    try:
        z85.decode(key)
    except (ValueError, struct.error):  # e.g. "#####" encodes a number over 2**32
        return "a CURVE key is Z85 text, this one does not decode"
    return None


def key_to_hex(key: bytes) -> str:
    """A Z85 public key as 64 hex digits: the spelling launchers put on a worker's command line.

    Z85 has ``$ ( ) & < > * ? [ ] { } # !`` and may begin with ``-``: a remote shell (``ssh``
    joins its arguments for one) or Kubernetes' ``$(VAR)`` expansion in a Pod's args would
    change the key, and argparse would take it for an option. Hex passes through all of them."""
    problem = _key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return bytes(z85.decode(key)).hex()


def key_from_text(text: str) -> bytes | None:
    """The Z85 public key ``text`` spells, as 40 Z85 characters or 64 hex digits; None if it
    is neither (a file name, say)."""
    if len(text) == 2 * _RAW_KEY_LENGTH:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            return None
        return bytes(z85.encode(raw))
    key = text.encode("ascii", "replace")
    return key if _key_problem(key) is None else None


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise ConfigError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE, so tcp workers cannot be "
            "authenticated; use a libzmq with CURVE (pyzmq's wheels have it) or local ipc workers"
        )


@dataclass(frozen=True, slots=True, repr=False)
class CurveKeys:
    """A CURVE key pair, both halves as 40 bytes of Z85 text. ``repr`` never shows the secret."""

    public: bytes
    secret: bytes

    def __post_init__(self) -> None:
        for name, key in (("public", self.public), ("secret", self.secret)):
            if (problem := _key_problem(key)) is not None:
                raise ValueError(f"{name} key: {problem}")

    @classmethod
    def generate(cls) -> CurveKeys:
        """A fresh key pair from libzmq."""
        _require_curve()
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def certificate(self) -> bytes:
        """The secret certificate's text, as :func:`write_keys` writes it and :func:`load_keys`
        reads it: a launcher hands a worker its keys this way (on a pipe, never in argv or env).
        """
        return _certificate(_SECRET_BANNER, self, with_secret=True)

    def __repr__(self) -> str:
        return f"CurveKeys(public={self.public!r}, secret=<hidden>)"


# --- key files --------------------------------------------------------------------------------

_PUBLIC_BANNER: Final = """\
#   ZeroMQ CURVE Public Certificate, written by andon.
#   Give it to the side that must recognise this key (an allow-list, or a worker's --server-key).

"""
_SECRET_BANNER: Final = """\
#   ZeroMQ CURVE **Secret** Certificate, written by andon.
#   DO NOT give this file to anyone, nor change its permissions.

"""


def _certificate(banner: str, keys: CurveKeys, *, with_secret: bool) -> bytes:
    lines = [banner, "metadata\n", "curve\n", f'    public-key = "{keys.public.decode()}"\n']
    if with_secret:
        lines.append(f'    secret-key = "{keys.secret.decode()}"\n')
    return "".join(lines).encode()


def write_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """Generate a key pair into ``folder/<name>.key`` and ``folder/<name>.key_secret``.

    Returns ``(public_path, secret_path)``. The secret file is created 0600, and ``folder`` 0700
    when it does not exist yet. Neither file is ever overwritten: an existing one is a
    :class:`ConfigError` naming it, and nothing is written.
    """
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"key name {name!r} must be a plain file name")
    keys = CurveKeys.generate()
    public_path = folder / f"{name}.key"
    secret_path = folder / f"{name}.key_secret"
    for path in (public_path, secret_path):
        if path.exists() or path.is_symlink():
            raise ConfigError(f"key file {path} already exists; not overwriting it")
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass  # an existing folder keeps the mode its owner gave it
    except OSError as error:
        raise ConfigError(f"cannot create key folder {folder}: {error.strerror}") from error
    else:
        folder.chmod(0o700)  # mkdir's mode is filtered by the umask
    # The secret first: if it cannot be written, no public half is left without its secret.
    _write_new(secret_path, keys.certificate(), 0o600)
    try:
        _write_new(public_path, _certificate(_PUBLIC_BANNER, keys, with_secret=False), 0o644)
    except ConfigError:
        secret_path.unlink()  # ours: written a moment ago, and useless without its public half
        raise
    return public_path, secret_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL makes "refuse to overwrite" atomic (the check above only gives the friendly error
    # before anything is written), and the mode is set at creation, so the secret is never
    # readable by others, not even for a moment.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError as error:
        raise ConfigError(f"key file {path} already exists; not overwriting it") from error
    except OSError as error:
        raise ConfigError(f"cannot write key file {path}: {error.strerror}") from error
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(fd, mode)  # the umask may have taken bits the public file should have
            file.write(data)
    except OSError as error:
        path.unlink()  # ours, half written
        raise ConfigError(f"cannot write key file {path}: {error.strerror}") from error


@dataclass(frozen=True, slots=True)
class _Certificate:
    public: bytes | None
    secret: bytes | None


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as error:
        raise ConfigError(f"{what} {path} does not exist") from error
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}") from error


def _parse_certificate(path: Path, what: str) -> _Certificate:
    """The keys of a certificate file; a malformed key names the file and line."""
    found: dict[str, bytes] = {}
    for number, line in enumerate(_read(path, what).splitlines(), start=1):
        name, equals, value = line.strip().partition(b"=")
        field = clean_text(name.strip())
        if not equals or field not in ("public-key", "secret-key"):
            continue  # comments, section names, metadata: not ours to judge (as pyzmq)
        key = value.strip(b" \t'\"")
        if (problem := _key_problem(key)) is not None:
            raise ConfigError(f"{path}:{number}: bad {field}: {problem}")
        found.setdefault(field, key)
    return _Certificate(found.get("public-key"), found.get("secret-key"))


def load_keys(path: Path) -> CurveKeys:
    """The key pair of a ``.key_secret`` certificate file written by :func:`write_keys`."""
    cert = _parse_certificate(path, "secret key file")
    if cert.public is None:
        raise ConfigError(f"{path} is not a CURVE certificate (it has no public-key line)")
    if cert.secret is None:
        raise ConfigError(
            f"{path} has no secret-key (a public certificate?); give the .key_secret file"
        )
    _require_curve()
    if zmq.curve_public(cert.secret) != cert.public:
        raise ConfigError(f"{path}: its public-key is not the one of its secret-key")
    return CurveKeys(cert.public, cert.secret)


def load_public_keys(path: Path) -> frozenset[bytes]:
    """The allow-list of worker public keys (Z85 bytes) at ``path``.

    ``path`` is a folder (every ``*.key`` certificate in it), one ``.key`` certificate, or a text
    file with one Z85 key per line, where blank lines and lines starting with ``#`` are ignored.
    A missing path, a bad key (naming file and line) or an empty list is a :class:`ConfigError`:
    an empty allow-list would only lock every worker out.
    """
    if path.is_dir():
        files = sorted(path.glob("*.key"))
        keys = frozenset(_public_of(file) for file in files)
        if not keys:
            raise ConfigError(f"allow-list folder {path} has no *.key files; no worker may connect")
        return keys
    if path.suffix == ".key":
        return frozenset([_public_of(path)])
    keys = frozenset(_key_lines(path))
    if not keys:
        raise ConfigError(f"allow-list {path} has no keys; no worker may connect")
    return keys


def _public_of(path: Path) -> bytes:
    public = _parse_certificate(path, "public key file").public
    if public is None:
        raise ConfigError(f"{path} is not a CURVE certificate (it has no public-key line)")
    return public


def _key_lines(path: Path) -> Iterable[bytes]:
    for number, line in enumerate(_read(path, "allow-list").splitlines(), start=1):
        key = line.strip()
        # A full-line comment cannot be mistaken for a key: the first Z85 digit of a 32-bit
        # chunk is at most 82, and '#' is digit 84.
        if not key or key.startswith(b"#"):
            continue
        if (problem := _key_problem(key)) is not None:
            # The line itself is not shown: it may be a secret key pasted by mistake.
            raise ConfigError(f"{path}:{number}: not a CURVE public key: {problem}")
        yield key


# --- socket options ---------------------------------------------------------------------------


def curve_server(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``sock`` (the supervisor's ROUTER) a CURVE server that asks ZAP about every client.

    Call it before ``bind``, and start the :class:`ZapAllowList` before that.
    """
    _require_curve()
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
    try:
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    except zmq.ZMQError as error:
        # Without it a missing handler means "everyone in": refuse to run rather than fail open.
        raise ConfigError(
            f"this libzmq ({zmq.zmq_version()}) lacks ZAP_ENFORCE_DOMAIN, so a CURVE server "
            "could not refuse clients when its allow-list is not running"
        ) from error


def curve_client(sock: zmq.Socket[Any], keys: CurveKeys, server_public: bytes) -> None:
    """Make ``sock`` (a worker's DEALER) a CURVE client of the server ``server_public``.

    Call it before ``connect``.
    """
    _require_curve()
    if (problem := _key_problem(server_public)) is not None:
        raise ConfigError(f"server public key: {problem}")
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


# --- the ZAP handler --------------------------------------------------------------------------


class ZapAllowList:
    """A ZAP handler that lets in CURVE clients whose public key is on the list.

    ``start(ctx)`` binds ``inproc://zeromq.zap.01`` in ``ctx`` (at most one handler per context)
    and serves it from a task that ``aclose()`` cancels and awaits. The list changes at run time
    with :meth:`allow` and :meth:`disallow`; ZAP is asked only during a handshake, so a change
    affects the next connection, never one already made. Every request not answered 200 counts
    in :attr:`refused` and goes to ``on_refused`` with a short reason (a raising ``on_refused``
    is logged; the handler keeps serving, since a dead handler would stall every handshake).
    """

    def __init__(
        self, keys: Iterable[bytes] = (), *, on_refused: Callable[[str], None] | None = None
    ) -> None:
        self._keys: set[bytes] = set()
        for key in keys:
            self.allow(key)
        self._on_refused = on_refused
        self._refused = 0
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def refused(self) -> int:
        """How many ZAP requests were answered with anything but 200."""
        return self._refused

    @property
    def keys(self) -> frozenset[bytes]:
        """The public keys (Z85) let in now."""
        return frozenset(self._keys)

    def allow(self, public_key: bytes) -> None:
        """Let ``public_key`` (Z85) in from the next handshake on."""
        if (problem := _key_problem(public_key)) is not None:
            raise ValueError(problem)
        self._keys.add(public_key)

    def disallow(self, public_key: bytes) -> None:
        """Refuse ``public_key`` from the next handshake on (a connected peer stays connected)."""
        self._keys.discard(public_key)

    async def start(self, ctx: zmq.asyncio.Context) -> None:
        """Bind the handler in ``ctx`` and start serving. Call it before the ROUTER binds."""
        if self._sock is not None:
            raise RuntimeError("this ZapAllowList is already started")
        sock = ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(_ZAP_ENDPOINT)  # EADDRINUSE: the context already has a ZAP handler
        except zmq.ZMQError:
            sock.close()
            raise
        self._sock = sock
        # Not in a TaskGroup: the task's lifetime is this object's, and aclose() cancels and
        # awaits it, so it never outlives its owner unobserved.
        self._task = asyncio.create_task(self._serve(sock), name="andon-zap")

    async def aclose(self) -> None:
        """Stop serving and close the socket (idempotent). Close the ROUTER first: from now on
        its handshakes fail (``curve_server`` enforces ZAP)."""
        task, sock = self._task, self._sock
        self._task = self._sock = None
        try:
            if task is not None:
                task.cancel()
                # wait() does not raise the task's cancellation; a cancellation of *our* caller
                # still propagates from here (and the finally closes the socket).
                await asyncio.wait([task])
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
        finally:
            if sock is not None:
                # Unbinding an inproc endpoint takes effect at once, while close() lets the
                # socket go in the background: until it has gone, a new handshake would still
                # send its ZAP request here and hang, unanswered, until the handshake times out.
                with contextlib.suppress(zmq.ZMQError):
                    sock.unbind(_ZAP_ENDPOINT)
                sock.close(linger=0)

    async def _serve(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart(copy=True)
            reply, refusal = _answer(frames, self._keys)
            # A REP must answer before it can receive again, so every request gets a reply,
            # even one too short to carry a request id.
            await sock.send_multipart(reply)
            if refusal is not None:
                self._refused += 1
                if self._on_refused is not None:
                    try:
                        self._on_refused(refusal)
                    except Exception:
                        _log.exception("on_refused callback %r raised", self._on_refused)


def _answer(frames: list[bytes], allowed: Set[bytes]) -> tuple[list[bytes], str | None]:
    """The ZAP reply to ``frames`` under the allow-list ``allowed``, and why it refused (or None).

    Request (RFC 27): version, request id, domain, address, routing id, mechanism, credentials...
    Reply: version, request id, status code, status text, user id, metadata.
    """
    request_id = frames[1] if len(frames) > 1 else b""
    if len(frames) < 6 or frames[0] != _ZAP_VERSION:
        return _reply(request_id, b"500", b"malformed ZAP request"), (
            f"malformed ZAP request ({len(frames)} frames)"
        )
    address, mechanism, credentials = frames[3], frames[5], frames[6:]
    peer = _printable(address) or "an unknown address"
    if mechanism != b"CURVE":
        return _reply(request_id, b"400", b"only CURVE is allowed"), (
            f"mechanism {_printable(mechanism)!r} from {peer} refused: only CURVE is allowed"
        )
    if len(credentials) != 1 or len(credentials[0]) != _RAW_KEY_LENGTH:
        return _reply(request_id, b"500", b"malformed CURVE credentials"), (
            f"malformed CURVE credentials from {peer}"
        )
    key = z85.encode(credentials[0])  # ZAP gives the raw 32 bytes; the list holds Z85
    if key not in allowed:
        return _reply(request_id, b"400", b"key not allowed"), (
            f"CURVE key {key.decode()} from {peer} is not on the allow-list"
        )
    return _reply(request_id, b"200", b"OK", user_id=key), None


def _reply(request_id: bytes, status: bytes, text: bytes, *, user_id: bytes = b"") -> list[bytes]:
    return [_ZAP_VERSION, request_id, status, text, user_id, b""]


def _printable(raw: bytes) -> str:
    # What a peer put in a frame, safe to show in a log line: short, and no control characters.
    text = clean_text(raw[:64])
    return "".join(c if c.isprintable() else "?" for c in text)


def is_every_address(host: str) -> bool:
    """Whether ``host`` (of a tcp endpoint) binds every address of this machine (``0.0.0.0``,
    ``::`` or zmq's ``*``): nobody can dial it as it is written."""
    return host in ("0.0.0.0", "::", "*")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address of a tcp endpoint) is this machine's loopback: the
    only place plain tcp without CURVE (``--insecure``) is allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
