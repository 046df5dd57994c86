"""Keeping the head and tail of a call's output while it streams (the full copy is the
supervisor's spill file)."""

from __future__ import annotations

__all__ = ["HeadTail"]


class HeadTail:
    def __init__(self, head_bytes: int, tail_bytes: int) -> None:
        self._head_limit = max(0, head_bytes)
        self._tail_limit = max(0, tail_bytes)
        self.head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self._tail_limit:
            self._tail += data
            if len(self._tail) > 2 * self._tail_limit:  # trim in batches, not per chunk
                del self._tail[: len(self._tail) - self._tail_limit]

    @property
    def tail(self) -> bytes:
        """The last bytes after the head (empty if everything fitted in the head)."""
        return bytes(self._tail[-self._tail_limit :]) if self._tail_limit else b""
