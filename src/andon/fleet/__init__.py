"""The fleet layer: the worker pool and the launchers that start its workers.

A pool keeps tool workers ready and leases one to each call; a launcher is how a worker comes to
exist (a fork of the local forkserver, a command such as ``ssh``, a container, a Kubernetes Pod).
The fleet knows workers, sockets and processes; it knows nothing of agents, turns, models or logs.
The supervisor's executor leases workers from it (``WorkerLease``, ``WorkerGone``: the two are
for that layer, not for users).

Users build with ``WorkerPool`` and ``WorkerPoolConfig`` (also ``andon.WorkerPoolConfig``), pick
or write a launcher (``WorkerLauncher`` with ``WorkerSpec``, ``PoolSetup`` and
``LaunchedWorker`` is the seam a custom one implements) and may watch a pool (``PoolObserver``).
"""

from andon.fleet._adopt import AdoptLauncher
from andon.fleet._command import CommandLauncher
from andon.fleet._container import ContainerLauncher, Mount, host_mounts
from andon.fleet._engine_check import check_container_engine
from andon.fleet._forkserver import ForkserverLauncher
from andon.fleet._launch import LaunchedWorker, PoolSetup, WorkerLauncher, WorkerSpec
from andon.fleet._pod import PodLauncher
from andon.fleet._pool import TcpListen, WorkerGone, WorkerLease, WorkerPool, WorkerPoolConfig
from andon.fleet._pool_watch import PoolObserver, PoolStatistics

__all__ = [
    "AdoptLauncher",
    "CommandLauncher",
    "ContainerLauncher",
    "ForkserverLauncher",
    "LaunchedWorker",
    "Mount",
    "PodLauncher",
    "PoolObserver",
    "PoolSetup",
    "PoolStatistics",
    "TcpListen",
    "WorkerGone",
    "WorkerLauncher",
    "WorkerLease",
    "WorkerPool",
    "WorkerPoolConfig",
    "WorkerSpec",
    "check_container_engine",
    "host_mounts",
]
