"""Fixtures of the CLI tests."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def killer() -> Iterator[list[subprocess.Popen[str]]]:
    """Started runs are SIGKILLed (their whole process group: each is started in a session of
    its own) if a test fails half-way; their pipes are closed either way."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
