"""A signal in the early phase that Python can only print (raised inside a weakref callback, an
import lock's, say) is still the signal that decides: no traceback, exit 128 + its number."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, weakref
    import andon.cli

    class Thing:
        pass

    def on_gone(_ref):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # a backward jump: the handler runs here, inside the callback
            pass

    thing = Thing()
    ref = weakref.ref(thing, on_gone)
    del thing
    sys.argv = ["andon", "check", sys.argv[1]]
    andon.cli.main()
    """
)


def test_a_stop_raised_where_python_can_only_print_it_still_decides(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "no-such-session")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr
    assert run.returncode == 130, run.stderr
