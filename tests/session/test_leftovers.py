"""Crash repair's leftover processes: what it kills, and the strangers it never touches.

Every test uses a session id of its own, so a second copy of the suite running beside this one
(same call ids, same commands) has processes with other tags, and neither touches the other's.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from andon.base import call_tag, session_id
from andon.session import (
    SessionRepaired,
    ToolStarted,
    kill_in_flight,
    load,
    read,
    repair,
)
from andon.session._leftovers import StartedCall, find_leftovers
from tests.session.helpers import write_crashed
from tests.support import alive_after, can_force_pids, spawn_at_pid


def _env(tag: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(procs.TAG_VAR, None)
    if tag is not None:
        env[procs.TAG_VAR] = tag
    return env


def _spawn(command: str, tag: str | None = None) -> subprocess.Popen[bytes]:
    """A 'tool' in its own group that prints ``started`` once everything it forks exists."""
    proc = subprocess.Popen(
        ["bash", "-c", command], stdout=subprocess.PIPE, start_new_session=True, env=_env(tag)
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    return proc


def _started(pid: int, **change: Any) -> ToolStarted:
    info = procs.stat(pid)
    assert info is not None
    fields: dict[str, Any] = {
        "turn": 1,
        "step": 1,
        "call_id": "c1-1-1",
        "worker": "w1",
        "host": socket.gethostname(),
        "pid": pid,
        "pgid": pid,
        "create_time": info.key.create_time,
        "containment": "pgroup",
    }
    fields.update(change)
    return ToolStarted(**fields)


def _end(proc: subprocess.Popen[bytes], *tags: str) -> None:
    """Stop a test's own tool (its group, led by our unreaped child) and whatever carries its
    tags; wait, with a bound, until all of it is gone."""
    if proc.poll() is None:
        procs.killpg_pinned(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
    for tag in tags:
        procs.signal_tagged(procs.tag_entry(tag), signal.SIGKILL, wait=5.0)


def _summary(loaded: Any) -> SessionRepaired:
    summary = loaded.events[-1].data
    assert isinstance(summary, SessionRepaired)
    return summary


def test_the_leader_and_its_children_are_killed_by_key_and_tag(tmp_path: Path) -> None:
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    proc = _spawn("sleep 60 & echo started; wait", tag)
    child = procs.descendants(proc.pid, procs.snapshot())
    try:
        write_crashed(tmp_path / "s", sid, _started(proc.pid))
        loaded = load(tmp_path / "s")
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert _summary(loaded).killed_leftovers == 2  # bash and its background sleep
        assert {lf.via for lf in loaded.report.leftovers} == {"leader", "tag"}
        assert alive_after(child, timeout=0) == []  # repair waited until both had exited
    finally:
        _end(proc, tag)


def test_an_untagged_process_at_the_recorded_pid_and_start_is_not_proof_enough(
    tmp_path: Path,
) -> None:
    # The key alone cannot tell a reused pid that started within the same clock tick.
    sid = session_id()
    proc = _spawn("sleep 60 & echo started; wait")
    try:
        write_crashed(tmp_path / "s", sid, _started(proc.pid))
        assert repair(tmp_path / "s", dry_run=True).leftovers == ()
        assert _summary(load(tmp_path / "s")).killed_leftovers == 0
        assert proc.poll() is None
    finally:
        _end(proc)


def test_an_escapee_that_left_the_tree_and_the_group_is_found_by_its_tag(tmp_path: Path) -> None:
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    # The subshell exits at once: the sleep re-parents away, in a session of its own.
    # It says "started" only once it is in its own session, out of the leader's group.
    proc = _spawn("(setsid bash -c 'echo started; exec sleep 60' &); wait", tag)
    try:
        record = _started(proc.pid)
        _end(proc)  # the leader is gone, as after a crash that the worker did not survive
        (escapee,) = procs.tagged(procs.tag_entry(tag))
        assert escapee.pgid != record.pgid
        write_crashed(tmp_path / "s", sid, record)
        loaded = load(tmp_path / "s")
        assert [(lf.pid, lf.via) for lf in loaded.report.leftovers] == [(escapee.pid, "tag")]
        assert _summary(loaded).killed_leftovers == 1
        assert alive_after([escapee], timeout=0) == []
    finally:
        _end(proc, tag)


@pytest.mark.parametrize(
    "change",
    [
        {"later": 1000.0},  # the call started after this process: it cannot be the call's
        {"host": "some-other-runner"},  # it ran on another machine
    ],
    ids=["other-start", "other-host"],
)
def test_a_process_that_is_not_provably_the_tool_is_never_touched(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    change = dict(change)
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    proc = _spawn("sleep 60 & echo started; wait", tag)
    try:
        record = _started(proc.pid)
        later = change.pop("later", 0.0)
        record = _started(proc.pid, create_time=record.create_time + later, **change)
        write_crashed(tmp_path / "s", sid, record)
        assert repair(tmp_path / "s", dry_run=True).leftovers == ()
        assert _summary(load(tmp_path / "s")).killed_leftovers == 0
        assert proc.poll() is None  # still running
    finally:
        _end(proc, tag)


def test_the_same_call_id_of_another_session_is_never_touched(tmp_path: Path) -> None:
    mine, theirs = session_id(), session_id()
    stranger_tag = call_tag(theirs, "c1-1-1")  # same call id, another session: a stranger
    stranger = _spawn("sleep 60 & echo started; wait", stranger_tag)
    gone = _spawn("echo started", call_tag(mine, "c1-1-1"))
    try:
        record = _started(gone.pid)
        _end(gone)
        write_crashed(tmp_path / "s", mine, record)
        assert repair(tmp_path / "s", dry_run=True).leftovers == ()
        assert _summary(load(tmp_path / "s")).killed_leftovers == 0
        assert stranger.poll() is None
    finally:
        _end(stranger, stranger_tag)


@pytest.mark.skipif(not can_force_pids(), reason="choosing the next pid needs root")
def test_after_forced_pid_reuse_the_stranger_at_the_recorded_pid_survives(tmp_path: Path) -> None:
    mine, theirs = session_id(), session_id()
    stranger_tag = call_tag(theirs, "c1-1-1")
    gone = _spawn("echo started", call_tag(mine, "c1-1-1"))
    record = _started(gone.pid)
    _end(gone)  # pid and group id are free again
    # Another session's tool (same call id, another tag) now holds the recorded pid, and leads a
    # group whose id is the recorded pgid: everything a pid-based repair would look at.
    stranger = spawn_at_pid(record.pid, ["sleep", "60"], env=_env(stranger_tag))
    if stranger is None:
        pytest.skip("the machine kept taking the pid; could not force its reuse")
    try:
        info = procs.stat(stranger.pid)
        assert info is not None and (info.pid, info.pgid) == (record.pid, record.pgid)
        write_crashed(tmp_path / "s", mine, record)
        assert repair(tmp_path / "s", dry_run=True).leftovers == ()
        assert _summary(load(tmp_path / "s")).killed_leftovers == 0
        assert stranger.poll() is None
    finally:
        stranger.kill()  # our own unreaped child
        stranger.wait(timeout=10)


@pytest.fixture
def cgroup_root() -> Iterator[Path]:
    writable = [root for root, ok in procs.cgroup2_mounts() if ok]
    if not writable:
        pytest.skip("no writable cgroup v2 hierarchy here")
    me = procs.stat(os.getpid())
    assert me is not None
    # The name a pool gives its tree today (andon.workers._containment.CgroupTree.new).
    name = f"andon-{me.pid}-s{me.start}-ns{procs.pid_namespace()}-{secrets.token_hex(4)}"
    folder = writable[0] / name
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroup v2 is not writable here: {exc}")
    try:
        yield folder
    finally:
        for leaf in folder.iterdir():
            if leaf.is_dir():
                procs.cgroup_kill(leaf)
                leaf.rmdir()
        folder.rmdir()


def _in_cgroup(leaf: Path, tag: str | None) -> subprocess.Popen[bytes]:
    leaf.mkdir(exist_ok=True)
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, env=_env(tag))
    (leaf / "cgroup.procs").write_text(str(proc.pid))
    return proc


def test_the_calls_cgroup_is_killed_when_every_member_carries_the_tag(
    tmp_path: Path, cgroup_root: Path
) -> None:
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    leaf = cgroup_root / f"call-{tag}"
    procs_in = [_in_cgroup(leaf, tag), _in_cgroup(leaf, tag)]
    try:
        leader = procs_in[0].pid
        started = _started(leader, containment="cgroup", cgroup=str(leaf))
        write_crashed(tmp_path / "s", sid, started)
        loaded = load(tmp_path / "s")
        assert [p.wait(timeout=10) for p in procs_in] == [-signal.SIGKILL] * 2
        assert sorted(lf.via for lf in loaded.report.leftovers) == ["leader", "tag"]
        assert _summary(loaded).killed_leftovers == 2
    finally:
        for p in procs_in:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def test_an_untagged_member_of_the_calls_cgroup_is_never_touched(
    tmp_path: Path, cgroup_root: Path
) -> None:
    # The path comes from the log: a stale or tampered one must not make repair kill anything
    # that does not also carry the call's tag, nor kill the cgroup as a whole.
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    leaf = cgroup_root / f"call-{tag}"
    ours, stranger = _in_cgroup(leaf, tag), _in_cgroup(leaf, None)
    try:
        started = _started(ours.pid, containment="cgroup", cgroup=str(leaf))
        write_crashed(tmp_path / "s", sid, started)
        loaded = load(tmp_path / "s")
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert [lf.pid for lf in loaded.report.leftovers] == [ours.pid]
        assert stranger.poll() is None
    finally:
        for p in (ours, stranger):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.mark.parametrize(
    "name", ["call-c1-1-1", "call-s-000000000000-c1-1-1", "../call-{tag}", "call-{tag}"]
)
def test_a_recorded_cgroup_is_trusted_only_if_its_path_names_this_call(
    cgroup_root: Path, name: str
) -> None:
    # The old naming (shared by every session), another session's call, a path that climbs out
    # of the pool's folder; only the last one is this call's.
    sid = session_id()
    tag = call_tag(sid, "c1-1-1")
    leaf = cgroup_root / name.format(tag=tag)
    if ".." not in name:
        leaf.mkdir()
    started = ToolStarted(
        1, 1, "c1-1-1", "w1", socket.gethostname(), 1, 1, 0.0, "cgroup", str(leaf)
    )  # fmt: skip
    plan = find_leftovers([StartedCall("c1-1-1", tag, started)])
    ((identity, found),) = plan.calls
    assert found == ()
    assert identity.cgroup == (leaf if name == "call-{tag}" else None)


def test_kill_in_flight_kills_the_logs_running_call_and_no_stranger(tmp_path: Path) -> None:
    # What ``andon run`` does on a third Ctrl-C: the same finding as repair, on a live log.
    mine, theirs = session_id(), session_id()
    tag, stranger_tag = call_tag(mine, "c1-1-1"), call_tag(theirs, "c1-1-1")
    proc = _spawn("sleep 60 & echo started; wait", tag)
    stranger = _spawn("sleep 60 & echo started; wait", stranger_tag)
    try:
        write_crashed(tmp_path / "s", mine, _started(proc.pid))
        assert kill_in_flight(read(tmp_path / "s"), wait=5.0) == 2
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert procs.tagged(procs.tag_entry(tag)) == []
        assert stranger.poll() is None
        assert len(procs.tagged(procs.tag_entry(stranger_tag))) == 2
    finally:
        _end(proc, tag)
        _end(stranger, stranger_tag)
