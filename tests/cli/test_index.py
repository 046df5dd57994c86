"""`andon check`, `andon resume` and `andon sessions` with the index of a long log beside it
(docs/log-format.md, The index of a long log), as the real executable."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from andon.session import INDEX_NAME
from andon.testing import MockModelServer
from tests.cli.support import env, records, run
from tests.session.helpers import long_log


def _check(folder: Path, cwd: Path) -> tuple[int, str, str]:
    result = run("check", str(folder), cwd=cwd)
    return result.returncode, result.stdout, result.stderr


def test_check_says_the_same_with_the_index_and_sees_a_changed_byte(tmp_path: Path) -> None:
    folder = long_log(tmp_path / "s")
    first = _check(folder, tmp_path)
    assert first[0] == 1 and "never ends" in first[1], first
    assert (folder / INDEX_NAME).is_file()  # left by the first (long) read
    assert _check(folder, tmp_path) == first  # from the index: the same report
    (folder / INDEX_NAME).unlink()
    assert _check(folder, tmp_path) == first
    # A seq changed in the part the index covers: a check that trusted it would miss it.
    log = folder / "events.jsonl"
    data = log.read_bytes()
    at = data.index(b'{"seq":700,') + len(b'{"seq":')
    log.write_bytes(data[:at] + b"800" + data[at + 3 :])
    code, out, err = _check(folder, tmp_path)
    assert code == 1 and "seq 800: [1]" in out and "Traceback" not in err, (out, err)


def test_resume_with_and_without_the_index_repairs_and_sends_the_same(tmp_path: Path) -> None:
    """A crashed long log, resumed once from a copy with a valid index and once from one
    without: the same closers are appended and the model is sent the same history."""
    plain = long_log(tmp_path / "plain")
    fast = tmp_path / "fast"
    shutil.copytree(plain, fast)
    assert _check(fast, tmp_path)[0] == 1 and (fast / INDEX_NAME).is_file()
    sent = [_resume(folder, tmp_path) for folder in (plain, fast)]
    assert len(sent[0]) == 2  # the queued message, then "carry on"
    assert sent[0] == sent[1]
    repaired = [
        [{k: r[k] for k in ("seq", "type", "data")} for r in records(f) if r.get("synthetic")]
        for f in (plain, fast)
    ]
    assert repaired[0] == repaired[1] and repaired[0]
    assert [r["type"] for r in repaired[0]][-3:] == ["step/end", "turn/end", "session/repaired"]
    for folder in (plain, fast):
        assert _check(folder, tmp_path)[0] == 0


def _resume(folder: Path, cwd: Path) -> list[Any]:
    """The messages of every model request of ``andon resume``."""

    async def go() -> list[Any]:
        async with MockModelServer([{"text": "Picking up."}] * 2) as server:
            spec = f"{server.base_url}#mock"
            answer = folder.parent / f"{folder.name}-answer.txt"
            result = await asyncio.to_thread(
                run,
                "resume",
                "--model",
                spec,
                "--output-last-message",
                str(answer),
                str(folder),
                "carry on",
                cwd=cwd,
            )
            assert result.returncode == 0, result.stderr
            assert "Picking up." in result.stdout
            # read from this run's records at its end (Agent.records_from)
            assert answer.read_text().strip() == "Picking up."
            return [request.body["messages"] for request in server.requests]

    return asyncio.run(go())


def test_sessions_lists_a_session_with_an_index_once(tmp_path: Path) -> None:
    root = tmp_path / "home" / "sessions"
    folder = long_log(root / "s-000000index")
    assert _check(folder, tmp_path)[0] == 1 and (folder / INDEX_NAME).is_file()
    result = run("sessions", "--json", cwd=tmp_path, environ=env(ANDON_HOME=str(root.parent)))
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["session_id"] for e in entries] == ["s-000000index"]
    assert "error" not in entries[0]
