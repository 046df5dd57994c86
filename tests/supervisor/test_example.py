"""The Python example in examples/ runs as the README says, on the user tier's names only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support import REPO
from tests.test_public_api import INTERNAL_FACES

EXAMPLE = Path(REPO) / "examples" / "first_stop.py"


def test_the_example_imports_only_names_for_users() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in imported if m in INTERNAL_FACES], imported


def test_the_example_stops_its_build() -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert '"ended_by": "interrupt"' in run.stdout, run.stdout[-2000:]
