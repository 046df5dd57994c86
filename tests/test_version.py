"""andon's version has one source, ``andon.base._version``: pyproject.toml reads it from there
(``dynamic``), so the installed metadata, ``andon.__version__`` and ``andon --version`` agree."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import andon

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_holds_no_version_of_its_own() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "andon.base._version.__version__"


def test_every_reader_sees_the_same_version() -> None:
    assert importlib.metadata.version("andon") == andon.__version__
    out = subprocess.run(
        [sys.executable, "-m", "andon", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == f"andon {andon.__version__}", out
