"""A new session folder appears under its name only with its first record synced
(``andon.session._create``): a crash at any moment leaves no session, or one that loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from andon.base import LogWriteFailed, SessionError, SessionLive
from andon.session import SessionLog, _create, check, is_temporary, load, read
from tests.session.helpers import Sim


def _temporaries(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if is_temporary(p.name)]


def test_the_folder_appears_with_its_first_record_synced(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    sim = Sim()
    sim.start()
    synced: list[int] = []

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        os.fsync(fd)

    with SessionLog.open(folder, fsync=fsync) as log:
        assert not folder.exists()  # opened, nothing written: no session yet
        [work] = _temporaries(tmp_path)
        assert work.stat().st_mode & 0o777 == 0o700
        log.append(sim.events[0][1])
        assert folder.is_dir() and _temporaries(tmp_path) == []
        assert synced and synced[0] > 0  # the record was synced before the folder was named
        assert log.session_dir == folder and log.path == folder / "events.jsonl"
    assert check(read(folder)) == []


def test_closed_before_the_first_record_leaves_nothing(tmp_path: Path) -> None:
    SessionLog.open(tmp_path / "s").close()
    assert list(tmp_path.iterdir()) == []


def test_a_name_taken_meanwhile_is_never_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    sim = Sim()
    sim.start()
    log = SessionLog.open(folder)
    folder.mkdir()  # another process took the name (an empty folder: rename would replace it)
    (folder / "theirs").write_text("keep")
    try:
        with pytest.raises(SessionLive, match="created by another process"):
            log.append(sim.events[0][1])
    finally:
        log.close()
    assert sorted(p.name for p in folder.iterdir()) == ["theirs"]


def test_an_empty_folder_taken_meanwhile_is_not_replaced_either(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    sim = Sim()
    sim.start()
    log = SessionLog.open(folder)
    folder.mkdir()
    try:
        with pytest.raises(SessionLive):
            log.append(sim.events[0][1])
        with pytest.raises(LogWriteFailed, match="created by another process"):
            log.append(sim.events[0][1])  # this writer holds no session
    finally:
        log.close()
    assert folder.is_dir() and list(folder.iterdir()) == []
    assert _temporaries(tmp_path) == []  # nothing of the loser is left


def test_without_renameat2_the_check_then_rename_path_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_create, "_RENAMEAT2", [None])
    sim = Sim()
    sim.start()
    with SessionLog.open(tmp_path / "s") as log:
        log.append(sim.events[0][1])
    assert check(read(tmp_path / "s")) == []
    with pytest.raises(FileExistsError):
        _create.publish(_create.make_temporary(tmp_path / "s"), tmp_path / "s", sync=False)


def test_an_interrupt_between_the_append_and_the_rename_is_mended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _create.publish
    calls = {"n": 0}

    def interrupted(work: Path, final: Path, *, sync: bool) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # what a signal handler raises, after the record is whole
        real(work, final, sync=sync)

    monkeypatch.setattr("andon.session._writer.publish", interrupted)
    sim = Sim()
    sim.start()
    sim.queue("hi")
    folder = tmp_path / "s"
    with SessionLog.open(folder) as log:
        with pytest.raises(KeyboardInterrupt):
            log.append(sim.events[0][1])
        assert log.next_seq == 1 and not folder.exists()
        log.append(sim.events[1][1])  # the next append names the folder
        assert folder.is_dir()
    assert [r.seq for r in read(folder)] == [0, 1]


def test_a_kill_before_the_first_record_leaves_no_session(tmp_path: Path) -> None:
    """A real process opens a new session and is SIGKILLed before it writes: nothing is named
    like a session; the hidden leftover is not loadable as one."""
    code = textwrap.dedent(
        f"""
        import os, signal
        from andon.session import SessionLog
        log = SessionLog.open({str(tmp_path / "s")!r})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "s").exists()
    assert len(_temporaries(tmp_path)) == 1  # hidden: nothing lists or loads it
    with pytest.raises(SessionError, match="not a session folder"):
        load(tmp_path / "s")
