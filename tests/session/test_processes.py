"""Real processes: kill -9 of a writer at random moments, a real file-size limit, no leftovers."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from andon.session import TurnEnd, TurnFailed, check, history, load, read
from tests.session.helpers import validate_request

CHILD = Path(__file__).with_name("_child.py")
RUNS = 30


def test_sigkill_at_random_moments_loses_nothing_that_was_written(tmp_path: Path) -> None:
    # Writers are forked by a zygote that has everything imported: a fresh interpreter per run
    # would spend most of this test importing.
    zygote = subprocess.Popen(
        [sys.executable, str(CHILD), "zygote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    rng = random.Random(20251202)
    try:
        for run in range(RUNS):
            folder = tmp_path / f"s{run}"
            fifo = tmp_path / f"acks{run}"
            os.mkfifo(fifo)
            zygote.stdin.write(f"run {folder} {run} {fifo}\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            acked: list[int] = []
            want = rng.randint(1, 300)
            with open(fifo, "rb") as acks:
                try:
                    # Wait on the pipe, not on time: kill once `want` appends were reported.
                    while len(acked) < want:
                        line = acks.readline()
                        assert line, f"run {run}: the writer died on its own"
                        acked.append(int(line))
                finally:
                    os.kill(pid, signal.SIGKILL)
                # every append that returned before the kill was reported (maybe still in the pipe)
                acked.extend(int(x) for x in acks.read().split())
            zygote.stdin.write(f"reap {pid}\n")
            zygote.stdin.flush()
            assert zygote.stdout.readline() == "reaped\n"  # gone, its lock released

            loaded = load(folder)
            by_seq = {r.seq: r for r in loaded.events}
            missing = [seq for seq in acked if seq not in by_seq or by_seq[seq].synthetic]
            assert not missing, f"run {run}: records {missing} were acknowledged but are gone"
            assert acked == list(range(len(acked)))
            assert check(loaded.events) == [], f"run {run}"
            validate_request(history(loaded.events))
            assert not load(folder).repaired
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)
        zygote.stdout.close()


@pytest.mark.parametrize(("headroom", "closers_fit"), [(4000, True), (40, False)])
def test_a_real_file_size_limit(tmp_path: Path, headroom: int, closers_fit: bool) -> None:
    folder = tmp_path / "s"
    done = subprocess.run(
        [sys.executable, str(CHILD), "fsize", str(folder), str(headroom), "20000"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["first"] == "LogWriteFailed" and report["errno"] == errno.EFBIG
    assert report["later"] == "LogWriteFailed" and report["failed"] is True

    records = read(folder)
    assert records.torn is None  # the partial line of the failed write was cut off
    size = (folder / "events.jsonl").stat().st_size
    assert size <= report["size_before"] + headroom
    last = records[-1].data
    if closers_fit:
        assert isinstance(last, TurnEnd) and isinstance(last.reason, TurnFailed)
        assert last.reason.code == "LOG_WRITE_FAILED"
        assert check(records) == []
    else:
        assert size == report["size_before"]  # nothing more fitted: cut back to the last record
        assert {v.rule for v in check(records)} == {2, 3}  # still open: repair closes it

    loaded = load(folder)
    assert loaded.repaired != closers_fit
    assert check(loaded.events) == []
    validate_request(history(loaded.events))
