"""andon.procs against real processes: keys, verified signals, and a kill that keeps up with
a call that forks while it is being killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from andon import procs
from andon.base import call_tag, executor_id
from tests.support import leftovers


def _tagged_env(tag: str) -> dict[str, str]:
    return {**os.environ, procs.TAG_VAR: tag}


def test_a_key_survives_the_round_trip_through_the_logs_seconds() -> None:
    key = procs.own_key()
    assert procs.ProcessKey.from_create_time(key.pid, key.create_time) == key


def test_a_pidfd_is_refused_for_a_key_whose_start_does_not_match() -> None:
    key = procs.own_key()
    assert procs.Pidfd.open(procs.ProcessKey(key.pid, key.start + 1)) is None
    fd = procs.Pidfd.open(key)
    assert fd is not None
    fd.close()


# Eight loops, each forking escaping children (a double fork: they re-parent away) as fast as it
# can, so forks land between any scan and its SIGKILL.
# Eight loops that keep forking long-lived children, a few hundred a second in all: often enough
# that some fork lands between a scan and its SIGKILL, and paced, so that a loaded machine does not
# turn them into tens of thousands of processes before the kill starts.
FORKERS = (
    "for j in 1 2 3 4 5 6 7 8; do (while :; do (sleep 1000 &); sleep 0.005; done) & done; "
    "echo ready; wait"
)


@pytest.mark.timeout(150)
def test_kill_call_keeps_killing_what_forks_while_it_is_being_killed() -> None:
    # Children forked between a scan and its SIGKILL inherit the tag; the next scan finds them.
    tag = call_tag(executor_id(), "c1-1-1")
    proc = subprocess.Popen(
        ["bash", "-c", FORKERS],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=_tagged_env(tag),
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        # The loops fork for as long as they live, so how many processes there are to kill
        # grows with how slow the machine is (thousands beside CPU hogs, each scan and each
        # death slower too): the bound is generous. It is not what the test is about: without
        # the rescans, no bound would catch what forked after the first scan.
        killed = procs.kill_call(procs.CallIdentity(tag), wait=30.0)
        assert killed >= 1
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert leftovers(procs.tag_entry(tag), timeout=10.0) == []
    finally:
        procs.signal_tagged(procs.tag_entry(tag), signal.SIGKILL, wait=5.0)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_signal_group_does_nothing_once_its_anchor_has_exited() -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    info = procs.stat(proc.pid)
    assert info is not None
    fd = procs.Pidfd.open(info.key, zombie_ok=True)
    assert fd is not None
    try:
        proc.wait(timeout=10)  # reaped: its number may be anyone's now
        assert procs.signal_group(fd, signal.SIGKILL) == 0
    finally:
        fd.close()


def test_an_empty_environment_is_looked_at_again_but_not_for_long() -> None:
    # `env -i`: a real process with a genuinely empty environment (what /proc also shows for a
    # moment while a process execs, which is why an empty read is retried).
    proc = subprocess.Popen(["env", "-i", "sleep", "30"])
    try:
        info = procs.stat(proc.pid)
        assert info is not None
        started = time.monotonic()
        assert not procs.carries(proc.pid, b"ANDON_CALL_TAG=x")
        assert time.monotonic() - started < 1.0  # a few ms of retries, generous bound
    finally:
        proc.kill()  # our own unreaped child
        proc.wait()


def test_child_ended_says_how_without_reaping() -> None:
    exits = subprocess.Popen(["sh", "-c", "exit 3"])
    killed = subprocess.Popen(["sh", "-c", "kill -9 $$"])
    running = subprocess.Popen(["sh", "-c", "read line"], stdin=subprocess.PIPE)
    try:
        for child in (exits, killed):
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # until it ended, unreaped
        assert procs.child_ended(exits.pid) == "exit status 3"
        assert procs.child_ended(killed.pid) == "killed by SIGKILL"
        assert procs.child_ended(exits.pid) == "exit status 3"  # still there: never reaped
        assert procs.child_ended(running.pid) is None
        assert procs.child_ended(os.getpid()) == "ended"  # not a child of ours
    finally:
        assert running.stdin is not None
        running.stdin.close()
        for child in (exits, killed, running):
            child.wait(timeout=30)


def test_a_pidfd_numbered_past_1024_is_still_watched() -> None:
    # A kill of a fast-forking call holds thousands of pidfds at once: select() refuses any
    # numbered 1024 or more ("filedescriptor out of range"), poll() does not.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1100 and (hard == resource.RLIM_INFINITY or hard > 1100):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    child = subprocess.Popen(["sh", "-c", "read line"], stdin=subprocess.PIPE)
    try:
        info = procs.stat(child.pid)
        assert info is not None
        opened = procs.Pidfd.open(info.key)
        assert opened is not None
        high = procs.Pidfd(os.dup2(opened.fd, 1100), info.key)
        opened.close()
        with high:
            assert not high.exited()
            assert child.stdin is not None
            child.stdin.close()
            assert procs.wait_exited([high], 30.0)
            assert high.exited()
    finally:
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()
        child.wait(timeout=30)
        if soft <= 1100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_subtree_finds_every_descendant_as_the_whole_proc_scan_does() -> None:
    # bash -> (bash -> sleep) x3 and a sleep of its own: children and grandchildren, a multi-level
    # tree; the walk of the children lists and the scan of every process must agree on it.
    # Each shell says a line once it has forked its sleep: the tree is whole after four lines.
    script = "for i in 1 2 3; do (sleep 60 & echo sub; wait) & done; sleep 60 & echo up; wait"
    leader = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE)
    try:
        assert leader.stdout is not None
        assert sorted(leader.stdout.readline() for _ in range(4)) == [b"sub\n"] * 3 + [b"up\n"]
        walked = procs.subtree(os.getpid())
        if walked is None:
            pytest.skip("this kernel lists no children (CONFIG_PROC_CHILDREN)")
        scanned = procs.descendants(os.getpid(), procs.snapshot())
        mine = {p.pid for p in scanned}
        assert leader.pid in mine and len(mine) >= 8  # the leader, 3 subshells, 4 sleeps
        # Anything else this test process runs (pytest's own helpers) is in both alike.
        assert {p.pid for p in walked} == mine
        assert all(p.ppid in mine | {os.getpid()} for p in walked)
    finally:
        for p in procs.descendants(os.getpid(), procs.snapshot()):
            procs.signal_key(p.key, signal.SIGKILL)
        leader.wait()
        if leader.stdout is not None:
            leader.stdout.close()
