"""The durable inbox: two ordered lists of user messages waiting to enter the conversation.

``next-turn``: each item is one future turn (``followup``). ``next-step``: every item enters the
next step of the running turn (``steer``, ``inject``). Every change is an ``agent/inbox/spliced``
record, written *before* the in-memory list changes, so a crash never loses a queued message and
never replays one twice: the log is the inbox's truth, the lists are its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from andon.session import InboxSpliced, UserMessage

__all__ = ["Inbox", "Target"]

Target = Literal["next-turn", "next-step"]

Write = Callable[[InboxSpliced], object]


class Inbox:
    def __init__(
        self,
        write: Write,
        next_turn: Sequence[UserMessage] = (),
        next_step: Sequence[UserMessage] = (),
    ) -> None:
        self._write = write
        self.next_turn: list[UserMessage] = list(next_turn)
        self.next_step: list[UserMessage] = list(next_step)

    @property
    def has_work(self) -> bool:
        return bool(self.next_turn or self.next_step)

    def insert(self, target: Target, message: UserMessage) -> None:
        items = self._items(target)
        self._write(InboxSpliced(target=target, start=len(items), inserted=(message,)))
        items.append(message)

    def claim_first_step(self) -> list[UserMessage]:
        """A turn's first step takes every next-step item and the first next-turn item."""
        claimed = self._take("next-step", len(self.next_step))
        claimed += self._take("next-turn", 1 if self.next_turn else 0)
        return claimed

    def claim_step(self) -> list[UserMessage]:
        """A later step takes only the next-step items."""
        return self._take("next-step", len(self.next_step))

    def clear(self) -> bool:
        """Drop everything on purpose (a cancel without ``keep_inbox``); True if anything was."""
        dropped = False
        targets: tuple[Target, Target] = ("next-step", "next-turn")
        for target in targets:
            items = self._items(target)
            if items:
                self._write(
                    InboxSpliced(
                        target=target,
                        start=0,
                        removed_count=len(items),
                        outcome="canceled",
                    )
                )
                items.clear()
                dropped = True
        return dropped

    def _take(self, target: Target, count: int) -> list[UserMessage]:
        if count == 0:
            return []
        items = self._items(target)
        # A claim is a splice without an outcome.
        self._write(InboxSpliced(target=target, start=0, removed_count=count))
        taken = items[:count]
        del items[:count]
        return taken

    def _items(self, target: Target) -> list[UserMessage]:
        if target == "next-turn":
            return self.next_turn
        if target == "next-step":
            return self.next_step
        raise ValueError(f"unknown inbox target {target!r}")
