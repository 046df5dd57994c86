"""The command line's argument parser class, on its own so that ``andon worker``'s light entry
(``andon.cli._worker``) shares it without importing the rest of the command."""

from __future__ import annotations

import argparse
import re
from typing import Any, Final

__all__ = ["EXIT_USAGE", "Parser"]

EXIT_USAGE: Final = 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), not a usage dump; and a word that
    starts with a minus and a digit (``--grace -1,2``, ``--workers -3``) is a (bad) value, never
    a flag: no flag of andon starts with a digit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"andon: {message} (see 'andon {self._sub_name()}--help')\n")

    def _sub_name(self) -> str:
        parts = self.prog.split()
        return f"{parts[1]} " if len(parts) > 1 else ""
