"""A small HTTP/1.1 server on loopback answering GETs from a table, for discovery tests: every
connection it accepted is closed when the block ends (nothing is left for the loop's end)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

__all__ = ["Answer", "Loopback", "ok", "serving"]

Answer = tuple[int, dict[str, str], bytes] | None  # None: never answer


class Loopback:
    """An HTTP/1.1 server on loopback answering GETs from a table; ``None`` hangs."""

    def __init__(self, answers: Mapping[str, Answer]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                self.seen.append((path, headers))
                answer = self.answers.get(path, (404, {}, b'{"error": "not found"}'))
                if answer is None:
                    await reader.read()  # hang until the client goes away
                    return
                status, extra, body = answer
                out = {"Content-Type": "application/json", "Content-Length": str(len(body))}
                text = "".join(f"{k}: {v}\r\n" for k, v in {**out, **extra}.items())
                writer.write(f"HTTP/1.1 {status} X\r\n{text}\r\n".encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.handlers.discard(task)
            writer.close()


@contextlib.asynccontextmanager
async def serving(
    answers: Mapping[str, Answer], host: str = "127.0.0.1"
) -> AsyncIterator[Loopback]:
    loopback = Loopback(answers)
    loopback.server = await asyncio.start_server(loopback.handle, host, 0)
    try:
        yield loopback
    finally:
        loopback.server.close()
        for task in list(loopback.handlers):
            task.cancel()
        await asyncio.gather(*loopback.handlers, return_exceptions=True)
        await loopback.server.wait_closed()


def ok(payload: object) -> Answer:
    return (200, {}, json.dumps(payload).encode())
