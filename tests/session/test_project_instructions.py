"""``project_instructions`` of ``session/start`` and ``session/resumed`` (docs/log-format.md,
Project instructions): an optional field that round-trips byte for byte, that logs without it
read as before, that ``check`` validates (rule 9), that the state fold takes off the prompt on
resume, and that ``andon log`` shows."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.base import LogCorrupted
from andon.session import Completed, Record, TextBlock, check, fold_state, read, render_transcript
from tests.session.helpers import Sim, lines_of

Log = list[dict[str, Any]]

SECTION = "\n\n# Project instructions\n\n--- AGENTS.md ---\nRun ./build.sh.\n"
DIGEST = hashlib.sha256(b"Run ./build.sh.\n").hexdigest()


def _added(chars: int = len(SECTION), **file: Any) -> dict[str, Any]:
    entry = {"path": "AGENTS.md", "sha256": DIGEST, "bytes": 16, **file}
    return {"root": "/home/ci/build", "files": [entry], "chars": chars}


def _log() -> Log:
    """A sound log whose start and resume both carry project instructions."""
    sim = Sim()
    sim.start()
    sim.queue("Build it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    sim.request()
    sim.reply([TextBlock("Done.")])
    sim.end_step()
    sim.end_turn(Completed())
    sim.resumed(repaired=False, pid=5151)
    log = [json.loads(line) for line in lines_of(sim.data())]
    for record in (log[0], log[-1]):
        assert record["type"] in ("session/start", "session/resumed")
        record["data"]["system_prompt"] += SECTION
        record["data"]["project_instructions"] = _added()
    return log


def test_the_field_round_trips_and_a_sound_log_checks() -> None:
    log = _log()
    assert check(log) == []
    for raw in (log[0], log[-1]):
        record = Record.from_dict(raw)
        assert record.to_dict() == raw
        added = record.data.project_instructions  # type: ignore[union-attr]
        assert added is not None and added.files[0].sha256 == DIGEST


def test_a_log_without_it_reads_checks_and_renders_as_before() -> None:
    log = _log()
    for record in (log[0], log[-1]):
        del record["data"]["project_instructions"]
    assert check(log) == []
    assert Record.from_dict(log[0]).to_dict() == log[0]
    assert "project instructions" not in render_transcript(log)
    # Without the field nothing is taken off the prompt: it is all base text.
    assert fold_state(log).base_system_prompt == log[-1]["data"]["system_prompt"]


def test_the_state_fold_gives_the_base_text_without_the_instructions() -> None:
    log = _log()
    state = fold_state(log)
    assert state.system_prompt == log[-1]["data"]["system_prompt"]
    assert state.base_system_prompt == log[-1]["data"]["system_prompt"][: -len(SECTION)]
    assert state.base_system_prompt is not None
    assert not state.base_system_prompt.endswith("Run ./build.sh.\n")


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "a path above the root": (
        _added(path="../secret/AGENTS.md"),
        "files[0].path '../secret/AGENTS.md' is not a relative path below the root",
    ),
    "an absolute path": (
        _added(path="/etc/AGENTS.md"),
        "files[0].path '/etc/AGENTS.md' is not a relative path below the root",
    ),
    "an empty path": (_added(path=""), "files[0].path '' is not a relative path below the root"),
    "a short hash": (_added(sha256="abc123"), "files[0].sha256 'abc123' is not 64 lower-case hex"),
    "an upper-case hash": (_added(sha256=DIGEST.upper()), "is not 64 lower-case hex digits"),
    "more chars than the prompt": (_added(chars=10**6), "chars is 1000000, but the instructions"),
    "no chars": (_added(chars=0), "chars is 0, but the instructions"),
    "no file": ({"root": "/r", "files": [], "chars": 3}, "names no file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("where", [0, -1])
def test_check_names_a_malformed_field_under_rule_9(case: str, where: int) -> None:
    log = _log()
    value, words = BAD[case]
    log[where]["data"]["project_instructions"] = copy.deepcopy(value)
    found = check(log)
    assert [(v.seq, v.rule) for v in found] == [(log[where]["seq"], 9)]
    assert words in found[0].message
    assert found[0].message.startswith(f"{log[where]['type']} project_instructions")


@pytest.mark.parametrize(
    "value",
    [
        "AGENTS.md",
        {"root": "/r", "files": "AGENTS.md", "chars": 3},
        {"root": "/r", "files": [{"path": "AGENTS.md", "sha256": DIGEST}], "chars": 3},
        {"root": "/r", "files": [], "chars": -1},
    ],
)
def test_a_field_of_the_wrong_shape_is_refused_where_it_is_read(
    tmp_path: Path, value: object
) -> None:
    log = _log()
    log[0]["data"]["project_instructions"] = value
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    with pytest.raises(LogCorrupted, match="project_instructions"):
        read(folder)
    done = subprocess.run(
        [sys.executable, "-m", "andon", "check", str(folder / "events.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("andon: cannot read the log: ") and "Traceback" not in done.stderr


def test_andon_log_shows_the_files_under_the_session_and_the_resume_lines() -> None:
    log = _log()
    log[-1]["data"]["project_instructions"]["files"][0]["truncated"] = True
    lines = render_transcript(log).splitlines()
    assert lines[1:4] == [
        "  cwd /home/ci/build",
        "  project instructions from /home/ci/build:",
        f"    AGENTS.md · 16 bytes · sha256 {DIGEST[:12]}",
    ]
    at = next(i for i, line in enumerate(lines) if line.startswith("resumed "))
    assert lines[at + 1 : at + 3] == [
        "  project instructions from /home/ci/build:",
        f"    AGENTS.md · 16 bytes, truncated · sha256 {DIGEST[:12]}",
    ]
