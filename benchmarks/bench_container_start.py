"""Container worker start, per image: a pool of one container worker, from its start to the
worker's ``hello``, beside the engine connection alone (docs/benchmarks.md, Container workers).

    python benchmarks/bench_container_start.py --engine URL --image IMAGE [--image IMAGE ...]
        [--runs 15] [--negotiate]

Every image runs its own ``andon`` (an image built from the recipe: docs/scale-out.md,
Building the worker image), as the invoking user, with the workspace bind-mounted, exactly as
``andon run --workers-in container:IMAGE`` starts it. With several images the runs alternate
between them, so that a change of load on the machine falls on each alike. Per image: p50 and
p95 of the pool's start (engine connect and image check, create + start, the worker's
interpreter and imports, ``hello``); and the engine connection alone, the launcher's (the API
version from ``/_ping``) beside docker-py's own negotiation (``GET /version``) and a ping.
``--negotiate`` adds, per image, pool starts whose launcher connects the docker-py way, as
andon's did before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any
from unittest import mock

from andon.cli.bench._stats import percentile
from andon.fleet import ContainerLauncher, WorkerPool, WorkerPoolConfig, _container, host_mounts
from andon.testing import worker_ulimits
from andon.workers import default


async def _start(url: str, image: str, workspace: str, negotiate: bool) -> float:
    launcher = ContainerLauncher(
        image,
        base_url=url,
        mounts=host_mounts([workspace], read_only=False),
        runtime="runc",
        ulimits=worker_ulimits(),
        user=f"{os.getuid()}:{os.getgid()}",
    )
    pool = WorkerPool(WorkerPoolConfig(size=1), default(), launcher=launcher)
    with mock.patch.object(
        _container, "_connect", _negotiated if negotiate else _container._connect
    ):
        t = time.perf_counter()
        await pool.start()
        elapsed = time.perf_counter() - t
    await pool.aclose()
    return elapsed


def _negotiated(docker: Any, base_url: str | None, timeout: float) -> Any:
    """docker-py's way: the API version from ``GET /version``, then a ping."""
    client = docker.DockerClient(base_url=base_url, timeout=timeout)
    client.ping()
    return client


def _connect(url: str, negotiate: bool) -> float:
    import docker

    t = time.perf_counter()
    client = (_negotiated if negotiate else _container._connect)(docker, url, 60.0)
    elapsed = time.perf_counter() - t
    client.close()
    return elapsed


async def _main(url: str, images: list[str], runs: int, negotiate: bool) -> None:
    ways = [False, True] if negotiate else [False]
    starts: dict[tuple[str, bool], list[float]] = {(i, w): [] for i in images for w in ways}
    connects: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as workspace:
        for _ in range(runs):
            for image, way in starts:
                starts[image, way].append(await _start(url, image, workspace, way))
            for way, times in connects.items():
                times.append(await asyncio.to_thread(_connect, url, way))
    print(f"container worker start, {runs} runs each (ms); load {os.getloadavg()[0]:.1f}")
    for (image, way), times in starts.items():
        p50, p95 = percentile(times, 50) * 1000, percentile(times, 95) * 1000
        how = "docker-py negotiation" if way else "andon's connect"
        print(f"  pool start to first hello, {image}, {how}: p50 {p50:.0f}  p95 {p95:.0f}")
    for way, times in connects.items():
        how = "docker-py negotiation + ping" if way else "andon's connect (ping names the version)"
        print(f"  engine connect alone, {how}: p50 {percentile(times, 50) * 1000:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, metavar="URL")
    parser.add_argument("--image", action="append", required=True, metavar="IMAGE")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--negotiate", action="store_true")
    args = parser.parse_args()
    asyncio.run(_main(args.engine, args.image, args.runs, args.negotiate))


if __name__ == "__main__":
    main()
