"""``andon`` whose local workers never say hello (``NoHello``, tests/faulty_workers.py): a pool
start that lasts until it is stopped, or until the start deadline. Run as ``python slow_start.py
ARGS`` in place of ``andon ARGS`` by the start-up signal tests.

With ``HOLD_SPAWN=FIFO`` in its environment, the forkserver's spawn window (the stop signals
blocked where the forkserver is spawned) is held open: it says ``spawn window held`` on stderr,
then waits until a writer opens ``FIFO`` and closes it. With ``PRELOAD=MODULE``, the forkserver
imports ``MODULE`` first (from its working directory, this process's), before andon's own modules.
The forkserver is not started ahead (``andon.cli._prestart_forkserver``) unless ``PRESTART=1``:
the window the tests hold is the pool's own start, inside the run; with ``PRESTART=1`` it is the
one at the command's very start, before anything else.

The command's own entry module is imported first, so the signal handlers are in place exactly as
in ``andon``; the faulty launcher (tests/faulty_launcher.py) is set where the CLI builds its
session options, in place of the default local one. A signal while this module
patches is a stop before anything started, as in ``andon`` itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import andon.cli
from andon.cli import _signals

HOLD_VAR = "HOLD_SPAWN"
PRELOAD_VAR = "PRELOAD"


def _patch() -> None:
    # The repository, so that the faulty workers' module is importable here and, through the
    # forkserver's copy of this path, in each worker (which unpickles its program by reference).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from andon.cli import _run, _setup
    from tests.faulty_launcher import FaultyLauncher
    from tests.faulty_workers import NoHello

    options = _setup.agent_options

    def with_fault(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = options(*args, **kwargs)
        assert out["launcher"] is None, "slow_start.py makes local workers slow"
        out["launcher"] = FaultyLauncher([], then=NoHello, containment="auto")
        return out

    setattr(_run, "agent_options", with_fault)  # noqa: B010 (what _run calls, not exported)
    if os.environ.get("PRESTART") != "1":
        setattr(andon.cli, "_prestart_forkserver", lambda argv: None)  # noqa: B010
    fifo = os.environ.get(HOLD_VAR)
    if fifo:
        from andon.fleet import _forkserver

        def hold() -> None:
            os.write(2, b"spawn window held\n")
            with open(fifo, "rb") as f:
                f.read()

        _forkserver._SpawnWindow.hook = hold
    preload = os.environ.get(PRELOAD_VAR)
    if preload:
        from andon.fleet import _forkserver

        _forkserver._PRELOAD = [preload, *_forkserver._PRELOAD]


if __name__ == "__main__":
    try:
        _patch()
    except BaseException as e:
        stop = _signals.stopped_in(e)
        if stop is None:
            raise
        # What andon's own entry does for a stop before anything started.
        code = 128 + stop.signum
        print("andon: stopped before anything started", file=sys.stderr, flush=True)
        if andon.cli._json_run(sys.argv[1:]):
            andon.cli._early_summary(code)
        sys.stdout.flush()
        os._exit(code)
    andon.cli.main()
