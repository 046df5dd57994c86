"""Container worker start, per image: a pool of one container worker, from its start to the
worker's ``hello``, beside the engine connection alone (docs/benchmarks.md, Container workers).

    python benchmarks/bench_container_start.py --engine URL --image IMAGE [--image IMAGE ...]
        [--runs 15]

Every image runs its own ``andon`` (an image built from the recipe: docs/scale-out.md,
Building the worker image), as the invoking user, with the workspace bind-mounted, exactly as
``andon run --workers-in container:IMAGE`` starts it. With several images the runs alternate
between them, so that a change of load on the machine falls on each alike. Per image: p50 and
p95 of the pool's start (engine connect and image check, create + start, the worker's
interpreter and imports, ``hello``); and once: a bare engine connection (client + ping), which
every pool's start pays before its first container.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from andon.cli.bench._stats import percentile
from andon.fleet import ContainerLauncher, WorkerPool, WorkerPoolConfig, host_mounts
from andon.testing import worker_ulimits
from andon.workers import default


async def _start(url: str, image: str, workspace: str) -> float:
    launcher = ContainerLauncher(
        image,
        base_url=url,
        mounts=host_mounts([workspace], read_only=False),
        runtime="runc",
        ulimits=worker_ulimits(),
        user=f"{os.getuid()}:{os.getgid()}",
    )
    pool = WorkerPool(WorkerPoolConfig(size=1), default(), launcher=launcher)
    t = time.perf_counter()
    await pool.start()
    elapsed = time.perf_counter() - t
    await pool.aclose()
    return elapsed


def _connect(url: str) -> float:
    import docker

    t = time.perf_counter()
    client = docker.DockerClient(base_url=url)
    client.ping()
    elapsed = time.perf_counter() - t
    client.close()
    return elapsed


async def _main(url: str, images: list[str], runs: int) -> None:
    starts: dict[str, list[float]] = {image: [] for image in images}
    connects: list[float] = []
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as workspace:
        for _ in range(runs):
            for image in images:
                starts[image].append(await _start(url, image, workspace))
            connects.append(await asyncio.to_thread(_connect, url))
    print(f"container worker start, {runs} runs per image (ms); load {os.getloadavg()[0]:.1f}")
    for image, times in starts.items():
        p50, p95 = percentile(times, 50) * 1000, percentile(times, 95) * 1000
        print(f"  pool start to first hello, {image}: p50 {p50:.0f}  p95 {p95:.0f}")
    print(f"  engine connect (client + ping): p50 {percentile(connects, 50) * 1000:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, metavar="URL")
    parser.add_argument("--image", action="append", required=True, metavar="IMAGE")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(_main(args.engine, args.image, args.runs))


if __name__ == "__main__":
    main()
