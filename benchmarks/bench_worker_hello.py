"""A worker's start, inside its image: from the exec of ``andon worker --connect ipc://…`` to
its first message (``hello``) on a socket of this script's, without any engine in the way
(docs/benchmarks.md, Container workers).

    python benchmarks/bench_worker_hello.py [--runs 31] [--full]

``--full`` alternates each run with ``andon --debug worker …``, which takes the full command's
path: the one every ``andon worker`` took before its light entry (alternating, so that a change
of load falls on both alike). Run it with the image's own Python, in a container of the image::

    podman run --rm --network none -v "$PWD/benchmarks:/b:ro" IMAGE \\
        /opt/andon/bin/python /b/bench_worker_hello.py --full

Prints p50 and p95 in ms per command. Each worker is killed once it has said hello.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import zmq


def _hello(ctx: zmq.Context[zmq.Socket[bytes]], command: list[str], endpoint: str) -> float:
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    argv = [*command, "worker", "--connect", endpoint, "--welcome-timeout", "5"]
    t = time.perf_counter()
    worker = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not sock.poll(30_000):
            raise SystemExit(f"{' '.join(argv)}: no hello within 30 s")
        sock.recv_multipart()
        return time.perf_counter() - t
    finally:
        worker.kill()
        worker.wait()
        sock.close(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--full", action="store_true", help="alternate with andon --debug worker")
    args = parser.parse_args()
    commands = [["andon"], ["andon", "--debug"]] if args.full else [["andon"]]
    times: dict[str, list[float]] = {" ".join(c): [] for c in commands}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="andon-hello-") as folder:
        for i in range(args.runs):
            for j, command in enumerate(commands):
                endpoint = f"ipc://{folder}/{i}-{j}.sock"
                times[" ".join(command)].append(_hello(ctx, command, endpoint))
    ctx.term()
    print(f"start to hello, {args.runs} runs each; load {os.getloadavg()[0]:.1f}")
    for name, sample in times.items():
        sample.sort()
        p50, p95 = sample[len(sample) // 2], sample[min(len(sample) - 1, int(len(sample) * 0.95))]
        print(f"  {name} worker: p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms")


if __name__ == "__main__":
    main()
