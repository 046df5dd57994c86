"""A worker's start, inside its image: from the exec of ``andon worker --connect ipc://…`` to
its first message (``hello``) on a socket of this script's, without any engine in the way
(docs/benchmarks.md, Container workers).

    python benchmarks/bench_worker_hello.py [--runs 31] [COMMAND ...]

``COMMAND`` is how andon starts (default ``andon``; ``andon --debug`` takes the full command's
path, the one every ``andon worker`` took before its light entry). Run it with the image's own
Python, in a container of the image::

    podman run --rm --network none -v "$PWD/benchmarks:/b:ro" IMAGE \
        /opt/andon/bin/python /b/bench_worker_hello.py

Prints p50 and p95 in ms. Each worker is killed once it has said hello.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time

import zmq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("command", nargs="*", default=["andon"])
    args = parser.parse_args()
    ctx = zmq.Context()
    times = []
    with tempfile.TemporaryDirectory(prefix="andon-hello-") as folder:
        for i in range(args.runs):
            endpoint = f"ipc://{folder}/{i}.sock"
            sock = ctx.socket(zmq.ROUTER)
            sock.bind(endpoint)
            argv = [*args.command, "worker", "--connect", endpoint, "--welcome-timeout", "5"]
            t = time.perf_counter()
            worker = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not sock.poll(30_000):
                worker.kill()
                worker.wait()
                raise SystemExit(f"{' '.join(argv)}: no hello within 30 s")
            sock.recv_multipart()
            times.append(time.perf_counter() - t)
            worker.kill()
            worker.wait()
            sock.close(0)
    ctx.term()
    times.sort()
    p50, p95 = times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.95))]
    print(
        f"{' '.join(args.command)} worker: start to hello p50 {p50 * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms ({args.runs} runs)"
    )


if __name__ == "__main__":
    main()
