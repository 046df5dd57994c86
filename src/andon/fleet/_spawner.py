"""The thread that spawns the workers' forkserver (docs/ci.md, Timeouts and cancellation): one for
the life of the process, with the stop signals blocked, and a parent-death signal for every process
it spawns (:func:`dying_with_this_thread`).

Why a thread of its own, and for good:

* A signal mask is per thread, and a child inherits the mask of the thread that forks it. The
  forkserver must start with SIGINT/SIGTERM/SIGHUP blocked (a CI runner signals the whole group, and
  one that dies of it takes the pool's start with it), but the thread that records andon's own
  signals must never block them: two signals pending together are handed over highest number
  first (the kernel keeps a set, not a queue; ``sigwaitinfo`` and a signalfd read that set in
  number order too), so the second could decide the exit code. Blocked only here, each signal is
  delivered as it arrives and recorded in that order.
* ``PR_SET_PDEATHSIG`` kills a child when the *thread* that forked it ends, not the process. A
  short-lived thread would kill the forkserver as it ends; this one ends only with the process,
  which is exactly when it must go. So a ``kill -9`` of andon at any moment takes it down at
  once, even while its interpreter still starts (seconds on a busy runner), before any line of it
  could watch anything.

The caller waits for the spawn synchronously.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import Final

__all__ = ["STOP_SIGNALS", "dying_with_this_thread", "in_spawner"]

STOP_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})

_PR_SET_PDEATHSIG: Final = 1


def in_spawner(job: Callable[[], None]) -> None:
    """Run ``job`` on the spawner thread and wait for it to end, even when a signal handler of the
    calling thread raises meanwhile (half a spawn must not outlive a restored environment): that
    exception is raised afterwards, as is the job's own."""
    done = threading.Event()
    failed: list[BaseException] = []
    _Spawner.submit((job, failed, done))
    interrupted: BaseException | None = None
    while not done.is_set():
        try:
            done.wait()
        except BaseException as e:  # a KeyboardInterrupt in a library caller's thread, say
            interrupted = interrupted or e
    if failed:
        raise failed[0]
    if interrupted is not None:
        raise interrupted


_Job = tuple[Callable[[], None], list[BaseException], threading.Event]


class _Spawner:
    lock: Final = threading.Lock()
    thread: threading.Thread | None = None
    jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    @classmethod
    def submit(cls, job: _Job) -> None:
        with cls.lock:
            if cls.thread is None or not cls.thread.is_alive():  # first use, or after a fork
                cls.jobs = queue.SimpleQueue()
                cls.thread = threading.Thread(target=cls.serve, name="andon-spawner", daemon=True)
                cls.thread.start()
            cls.jobs.put(job)

    @classmethod
    def serve(cls) -> None:
        jobs = cls.jobs
        while True:
            job, failed, done = jobs.get()
            try:
                # Again before every job: whatever a job did to this thread's mask is undone.
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                job()
            except BaseException as e:
                failed.append(e)
            finally:
                done.set()


def dying_with_this_thread() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a process spawned on the spawner thread: SIGKILL when its parent
    thread (this one, which ends only with the process) ends, and an exit at once if the parent
    is already gone (it may have died before the signal was asked for). None where ``prctl``
    cannot be reached: the child starts as before, without it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
