"""A supervisor sweeps the cgroup trees of dead supervisors, and only theirs.

The cgroup hierarchy is one for the whole machine, shared by every pid namespace (a container's
andon, one started under ``unshare --pid``): a pid that does not exist here may be a live
supervisor in another namespace, and a pid that exists may be another process than the one that
made the tree. Each tree's name carries its supervisor's pid, start time and pid namespace; only
trees of the sweeper's own namespace whose supervisor is gone are swept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from andon import procs
from andon.base import User
from andon.workers._containment import CgroupTree, cgroup2_root
from tests.support import REPO
from tests.workers.support import bash, running_pool, start


@pytest.fixture
def root() -> Path:
    found = cgroup2_root()
    if found is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    return found


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "1000"])
    try:
        yield proc
    finally:
        proc.kill()  # our own unreaped child
        proc.wait(timeout=10)


def _tree(root: Path, name: str, member: subprocess.Popen[bytes] | None = None) -> Path:
    base = root / name
    leaf = base / "call-test"
    leaf.mkdir(parents=True)
    if member is not None:
        CgroupTree.enter(leaf, member.pid)
    return base


def _remove(base: Path) -> None:
    for leaf in base.iterdir():
        if leaf.is_dir():
            procs.cgroup_kill(leaf)
            leaf.rmdir()
    base.rmdir()


def test_a_tree_of_another_pid_namespace_is_never_swept(
    root: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that does not exist here: it may be a live supervisor over there
    ns = procs.pid_namespace()
    assert ns is not None
    base = _tree(root, f"andon-{gone.pid}-s1-ns{ns + 1}-0123abcd", sleeper)
    try:
        CgroupTree.sweep_stale(root)
        assert base.is_dir()
        assert sleeper.poll() is None  # the process in it was not killed
    finally:
        sleeper.kill()  # our own unreaped child; gone (and reaped) before its cgroup is removed
        sleeper.wait(timeout=10)
        _remove(base)


def test_a_tree_whose_pid_now_names_another_process_is_swept(root: Path) -> None:
    me = procs.stat(os.getpid())
    assert me is not None
    # This very pid, but started at another time: the supervisor that made the tree is gone.
    base = _tree(root, f"andon-{me.pid}-s{me.start + 1}-ns{procs.pid_namespace()}-0123abcd")
    CgroupTree.sweep_stale(root)
    assert not base.exists()


def test_a_tree_of_a_live_supervisor_is_left_alone(root: Path) -> None:
    tree = CgroupTree.new(root, os.getpid())
    tree.create_base()
    try:
        CgroupTree.sweep_stale(root)
        assert tree.base.is_dir()
        owner = CgroupTree.parse_base(tree.base.name)
        assert owner is not None and owner.pid == os.getpid()
    finally:
        tree.base.rmdir()


def test_an_older_tree_name_is_not_judged(root: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    base = _tree(root, f"andon-{gone.pid}-0123abcd")  # no start time, no namespace: no proof
    try:
        CgroupTree.sweep_stale(root)
        assert base.is_dir()
    finally:
        _remove(base)


@pytest.mark.timeout(60)
async def test_an_andon_in_another_pid_namespace_leaves_our_running_call_alone(
    root: Path, tmp_path: Path
) -> None:
    """The reproduction: a pool started under ``unshare --pid --mount-proc`` (a container's
    andon, on the same cgroup hierarchy) used to find our tree's pid missing from its /proc and
    kill our workers and the call they ran."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"no new pid namespace here: {probe.stderr.decode().strip()}")
    other = textwrap.dedent(
        """
        import asyncio
        from andon.fleet import WorkerPool, WorkerPoolConfig
        from andon.workers import default

        async def main():
            async with WorkerPool(WorkerPoolConfig(size=1, containment="cgroup"), default()):
                pass

        asyncio.run(main())
        """
    )
    async with running_pool("cgroup") as (pool, executor):
        task, recorder, controller = await start(executor, bash("c1-1-1", "echo ready; sleep 1000"))
        await recorder.wait_output(b"ready")
        ran = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", other],
            capture_output=True,
            cwd=REPO,
            timeout=50,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr.decode()[-2000:]
        assert not task.done()  # our call still runs: nothing of ours was touched
        assert len(pool.workers) == 1
        controller.abort(User())
        outcome = await task
        assert outcome.ended_by == "interrupt"  # stopped by us, not lost
