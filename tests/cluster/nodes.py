"""Several Ray nodes on one host, as Ray's own tests make them (`ray.cluster_utils.Cluster`):
each node is its own raylet with its own resources and processes. What the node drills
need: start a head and worker nodes, find every process of a node (its raylet, Ray's agents
and workers, and what those started: a rank's reaper, server and vLLM engine core), kill
or freeze them all at once, and find what a run left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEAD_RESOURCE = "head"
WORKER_RESOURCE = "worker"
LOOPBACK = "127.0.0.1"
"""Every node's Ray address: the nodes, their actors' servers and the test traffic stay on
this host's loopback (pass it to `RayCluster(node_ip_address=...)` for the driver)."""
NODE_ENV = {
    # Ray's memory monitor kills workers when the whole host passes 95% of its memory; on a
    # machine shared with other jobs it would kill processes the drills did not aim at.
    "RAY_memory_monitor_refresh_ms": "0",
    # Ray's own switch for one-host clusters: every process (the driver's address included,
    # which Ray otherwise resolves from 127.0.0.1 to the host's address) takes loopback.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
"""The environment the node fixtures set while the nodes run."""

# Ray's node failure detection, lowered from its defaults (3 s x 5) but kept longer than a
# freeze drill: a node frozen past bubblespec's rank timeout must not be declared dead by
# Ray too (then Ray would restart its actors elsewhere, and the drill would be a kill).
RAY_SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 2000,
    "health_check_failure_threshold": 30,
}


def _ppids() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            out[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(roots: Iterable[int]) -> set[int]:
    """`roots` and every process below them (by parent pid)."""
    parents = _ppids()
    found = {r for r in roots if r in parents}
    while True:
        more = {p for p, pp in parents.items() if pp in found and p not in found}
        if not more:
            return found
        found |= more


def _state(stat: Path) -> str:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie: any of its threads (a killed multi-threaded process's
    leader is a zombie while its other threads still exit, holding its files and sockets)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    return any(_state(t / "stat") not in ("Z", "X") for t in tasks)


def wait_gone(pids: Iterable[int], timeout_s: float = 60.0) -> list[int]:
    """The pids still alive after `timeout_s` (empty: all gone)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has `name=value` (a run's marker reaches every process a
    role starts, vLLM's engine core included, whatever its command line says)."""
    needle = f"{name}={value}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                if needle in env and alive(int(entry)):
                    out.append(int(entry))
    return out


def with_cmdline(text: str) -> list[int]:
    """Processes whose command line contains `text` (a Ray session directory)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                if text.encode() in cmd and alive(int(entry)):
                    out.append(int(entry))
    return out


@dataclass
class RayNodes:
    """A head (synchronizer and gateway: resource `head`) and worker nodes (ranks: resource
    `worker`), each a raylet of one `ray.cluster_utils.Cluster` on this host."""

    workers: int = 2
    cpus_per_worker: int = 1
    cluster: Any = None
    nodes: list[Any] = field(default_factory=list)
    session_dir: str = ""

    def start(self) -> RayNodes:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {HEAD_RESOURCE: 1}, "node_ip_address": LOOPBACK,
            "_system_config": RAY_SYSTEM_CONFIG, "include_dashboard": False})
        self.session_dir = str(self.cluster.head_node.get_session_dir_path())
        for _ in range(self.workers):
            self.add_worker()
        return self

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_worker(self) -> Any:
        node = self.cluster.add_node(num_cpus=self.cpus_per_worker, node_ip_address=LOOPBACK,
                                     resources={WORKER_RESOURCE: 1})
        self.nodes.append(node)
        return node

    def node_of(self, node_id: str) -> Any:
        """The worker node (cluster_utils' `Node`) with Ray node id `node_id`."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"no worker node {node_id}")

    def pids(self, node: Any) -> set[int]:
        """Every process of `node`: what Ray started for it, and everything below those."""
        roots = [p.process.pid for infos in node.all_processes.values() for p in infos]
        return descendants(roots)

    def raylet(self, node: Any) -> int:
        """The pid of `node`'s raylet (its node agent)."""
        return int(node.all_processes["raylet"][0].process.pid)

    def kill_agent(self, node: Any) -> None:
        """The node agent dies, the machine lives: SIGKILL to the raylet alone (as an OOM
        kill or a crash of it); Ray's own processes of the node go with it, and whatever the
        node's workers started is on its own. Then Ray's bookkeeping of the removed node."""
        os.kill(self.raylet(node), signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    def kill(self, node: Any) -> set[int]:
        """The node is lost at once, as a machine is: SIGKILL to every one of its processes
        (found again until none is left, since a dying parent's child may be reparented);
        then Ray's own bookkeeping of the removed node. The pids killed."""
        killed: set[int] = set()
        for _ in range(5):
            pids = self.pids(node) - killed
            if not pids:
                break
            signal_all(pids, signal.SIGKILL)
            killed |= pids
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)
        return killed

    def shutdown(self) -> None:
        """Stop every node (safe to call twice), then SIGKILL anything of the session left."""
        if self.cluster is not None:
            import ray

            ray.shutdown()  # cluster_utils refuses to remove the node a driver is attached to
            with contextlib.suppress(Exception):
                self.cluster.shutdown()
            self.cluster = None
            self.nodes.clear()
        if self.session_dir:
            signal_all(with_cmdline(self.session_dir), signal.SIGKILL)


@contextlib.contextmanager
def ray_nodes(workers: int = 2) -> Iterator[RayNodes]:
    """Started nodes, with `NODE_ENV` set (this process's Ray on loopback too) while they
    run; stopped on exit."""
    import pytest
    from ray._private import ray_constants

    with pytest.MonkeyPatch.context() as mp:
        for k, v in NODE_ENV.items():
            mp.setenv(k, v)
        # read by this process's Ray at import: the driver takes loopback as well
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        nodes = RayNodes(workers=workers)
        try:
            yield nodes.start()
        finally:
            nodes.shutdown()
