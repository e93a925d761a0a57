"""Placement of a RayCluster: what it asks, whether Ray can ever place it, what it says when it
waits; and a role's server dying with its node agent. The rules without Ray, then three Ray
nodes of this host on loopback (a head with 1 CPU, two worker nodes with 1 CPU and a `worker`
resource each; no engines):

- a request no node set can hold fails in seconds, naming what was asked, what each node
  offers and the fix; one that waits for resources in use is reported within seconds;
- the synchronizer is placed before the rank bundles, so STRICT_SPREAD without a bundle
  resource puts the bundles on the worker nodes, not on the head the roles need;
- a role's server on a worker node whose raylet is SIGKILLed (Ray then SIGKILLs the dying
  worker's children, the reaper among them) leaves no process and no bound port after 10 s,
  and its restarted actor binds the same port: three times in a row.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bubblespec.cluster import ClusterError
from bubblespec.cluster.ray_placement import (
    RayNode,
    bundles_fit,
    fits,
    infeasible,
    pending,
    plan_bundles,
    roles_fit,
)
from tests.cluster.helpers import process_group
from tests.cluster.nodes import LOOPBACK, WORKER_RESOURCE, RayNodes, ray_nodes, wait_gone


def _node(name: str, cpu: float, driver: bool = False, free: float | None = None,
          **extra: float) -> RayNode:
    total = {"CPU": cpu, "memory": 1e9, f"node:{name}": 1.0, **extra}
    return RayNode(node_id=name * 8, ip=name, total=total,
                   available={**total, "CPU": cpu if free is None else free}, driver=driver)


HEAD, W1, W2 = _node("h", 1, driver=True), _node("a", 1, worker=1), _node("b", 1, worker=1)


def test_fits_counts_copies() -> None:
    assert fits({"CPU": 1}, {"CPU": 2.5}) == 2
    assert fits({"CPU": 1, "worker": 1}, {"CPU": 4}) == 0
    assert fits({"CPU": 0.5}, {"CPU": 1.0}) == 2


def test_bundles_fit_per_strategy_with_the_roles_on_the_driver() -> None:
    two = plan_bundles(2, 1, gpus=False, cpus_per_bundle=1)
    three = plan_bundles(3, 1, gpus=False, cpus_per_bundle=1)
    nodes = [HEAD, W1, W2]
    assert bundles_fit(two, "STRICT_SPREAD", nodes, role_cpus=0.5)
    # the head's CPU goes to the synchronizer and the gateway: two nodes for three bundles
    assert not bundles_fit(three, "STRICT_SPREAD", nodes, role_cpus=0.5)
    assert bundles_fit(three, "STRICT_SPREAD", nodes, role_cpus=0.0)
    assert not bundles_fit(two, "STRICT_PACK", nodes, role_cpus=0.5)
    assert bundles_fit(two, "PACK", nodes, role_cpus=0.5)
    assert not bundles_fit(three, "SPREAD", nodes, role_cpus=0.5)
    worker = plan_bundles(2, 1, gpus=False, cpus_per_bundle=1, extra={"worker": 1})
    assert bundles_fit(worker, "STRICT_SPREAD", nodes, role_cpus=0.5)
    busy = [HEAD, _node("a", 1, free=0, worker=1), W2]
    assert bundles_fit(worker, "SPREAD", busy, role_cpus=0.5)  # on the totals: can be placed
    assert not bundles_fit(worker, "SPREAD", busy, role_cpus=0.5, free=True)  # not now
    assert roles_fit(nodes, 0.5) and not roles_fit(nodes, 0.6)
    assert not roles_fit([W1, W2], 0.5)  # no driver node among them


def test_the_infeasible_message_names_the_request_the_nodes_and_the_fix() -> None:
    three = plan_bundles(3, 1, gpus=False, cpus_per_bundle=1)
    why = infeasible(three, "STRICT_SPREAD", [HEAD, W1, W2], 0.5)
    assert why.startswith("infeasible: the rank bundles")
    assert "3 rank bundle(s) of {CPU: 1} (STRICT_SPREAD)" in why
    assert "2 x {CPU: 0.5} on the driver's node" in why
    assert "node h hhhhhhhh (driver: synchronizer, gateway): free {CPU: 1} of {CPU: 1}" in why
    assert "node a aaaaaaaa: free {CPU: 1, worker: 1} of {CPU: 1, worker: 1}" in why
    assert "--bundle-resource" in why and "--cpus-per-bundle" in why
    assert "memory" not in why and "node:" not in why  # Ray's bookkeeping left out
    assert infeasible(three, "PACK", [HEAD, W1, W2, _node("c", 2)], 0.5) == ""
    assert "driver's node cannot hold" in infeasible(three, "PACK", [HEAD, W1, W2], 1.0)
    text = pending("the rank bundles' placement group", 5.2, three, "PACK", [HEAD], 0.5)
    assert text.startswith("the rank bundles' placement group pending for 5 s")


# --------------------------------------------------------------- on three Ray nodes

ray = pytest.importorskip("ray")
from bubblespec.cluster.ray import RayCluster
from bubblespec.cluster.ray_actors import RoleSpec, SyncActor


@pytest.fixture(scope="module")
def nodes() -> Iterator[RayNodes]:
    with ray_nodes(workers=2) as n:
        yield n


def _cluster(nodes: RayNodes, tmp_path: Any, **kw: Any) -> RayCluster:
    return RayCluster(address=nodes.address, node_ip_address=LOOPBACK, model="unused",
                      name=f"bsplace{uuid.uuid4().hex[:4]}", log_dir=str(tmp_path),
                      grace_s=2, **kw)


def test_an_infeasible_start_fails_at_once_with_the_fix(nodes: RayNodes, tmp_path: Any
                                                        ) -> None:
    c = _cluster(nodes, tmp_path, ranks=3, strategy="STRICT_SPREAD", start_timeout_s=900)
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as err:
        c.start()
    assert time.monotonic() - t0 < 30
    text = str(err.value)
    assert "infeasible" in text and "3 rank bundle(s) of {CPU: 1} (STRICT_SPREAD)" in text
    assert f"node {LOOPBACK}" in text and "(driver: synchronizer, gateway)" in text
    assert "--bundle-resource" in text
    assert not c.actors and not ray.is_initialized()  # nothing started, all stopped


@pytest.mark.slow  # CI time (docs/results.md, run 17): make test-slow
def test_a_start_waiting_for_resources_in_use_says_so_within_seconds(
        nodes: RayNodes, tmp_path: Any) -> None:
    ray.init(address=nodes.address, _node_ip_address=LOOPBACK, namespace="bsplace")
    blocker = ray.util.placement_group([{"CPU": 1, WORKER_RESOURCE: 1}] * 2,
                                       strategy="STRICT_SPREAD")
    ray.get(blocker.ready(), timeout=60)
    said: list[tuple[float, str]] = []
    t0 = time.monotonic()
    c = _cluster(nodes, tmp_path, ranks=2, strategy="SPREAD",
                 bundle_resources={WORKER_RESOURCE: 1}, start_timeout_s=40, report_after_s=2,
                 progress=lambda m: said.append((time.monotonic() - t0, m)))
    try:
        with pytest.raises(ClusterError, match="placement group not placed in 40 s"):
            c.start()
    finally:
        ray.util.remove_placement_group(blocker)
        ray.shutdown()
    assert said, "no report while the placement group waited"
    when, text = said[0]
    assert "placement group pending" in text and "resources exist but are in use" in text
    assert "2 rank bundle(s) of {CPU: 1, worker: 1} (SPREAD)" in text
    assert "free {CPU: 0, worker: 0} of {CPU: 1, worker: 1}" in text
    # reported a few seconds after the synchronizer was up, not at the deadline
    assert when < 30, when


def test_strict_spread_keeps_the_head_for_the_roles(nodes: RayNodes, tmp_path: Any) -> None:
    """No bundle resource: the synchronizer takes its CPU on the head before the bundles are
    reserved, so the bundles go to the worker nodes (and the gateway will fit on the head)."""
    c = _cluster(nodes, tmp_path, ranks=2, strategy="STRICT_SPREAD", start_timeout_s=120)
    try:
        c._connect()
        c._start_sync_and_reserve(time.monotonic() + 120)
        placed = set(ray.util.placement_group_table(c._pg)["bundles_to_node_id"].values())
        assert placed == {n.node_id for n in nodes.nodes}
        head = next(n for n in c.nodes() if n.driver)
        assert head.available.get("CPU", 0) >= c.role_cpus  # room left for the gateway
        assert c.info["sync"]["address"].startswith(f"{LOOPBACK}:")
    finally:
        c.stop()


def _listening(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(1.0)
        return s.connect_ex((LOOPBACK, port)) == 0


def _info(actor: Any, incarnation: int, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ray.exceptions.RayError):
            info = ray.get(actor.info.remote(), timeout=5)
            port = int(info["address"].rsplit(":", 1)[1])
            if info["incarnation"] >= incarnation and info["alive"] and _listening(port):
                return dict(info)
        assert time.monotonic() < deadline, f"incarnation {incarnation} not serving"
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.nodes
def test_a_role_dies_with_its_node_agent_three_times_in_a_row(nodes: RayNodes, tmp_path: Any
                                                              ) -> None:
    """The actor takes a worker node's whole `worker` resource and a placement group holds
    the other's, so that no restart (whose actor would kill what its predecessor left, from
    the state file this host's nodes share) can happen before the check: only the sentinel
    can have killed the role."""
    ray.init(address=nodes.address, _node_ip_address=LOOPBACK, namespace="bsorphan")
    spec = RoleSpec(role="sync", name="sync", run_id=uuid.uuid4().hex[:12],
                    state_dir=str(tmp_path))
    actor = ray.remote(SyncActor).options(  # on a worker node, as a rank is
        name="orphan-drill", num_cpus=0, resources={WORKER_RESOURCE: 1},
        max_restarts=3).remote(spec)
    blocker = None
    try:
        first = _info(actor, 0)
        blocker = ray.util.placement_group([{WORKER_RESOURCE: 1}])
        ray.get(blocker.ready(), timeout=60)
        port = int(first["address"].rsplit(":", 1)[1])
        for attempt in range(3):
            info = _info(actor, attempt)
            assert int(info["address"].rsplit(":", 1)[1]) == port  # the same port each time
            node = nodes.node_of(info["node_id"])
            group = [info["pid"], *process_group(info["pid"])]  # reaper, sentinel, server
            assert len(group) >= 3
            killed = time.monotonic()
            nodes.kill_agent(node)
            assert not wait_gone(group, 10), f"attempt {attempt}: the role outlived its raylet"
            while _listening(port):  # a dying process's last threads may hold it briefly
                assert time.monotonic() - killed < 10, f"attempt {attempt}: its port is bound"
                time.sleep(0.1)
            nodes.add_worker()
        last = _info(actor, 3)  # restarted on the joined node, bound to its port again
        assert int(last["address"].rsplit(":", 1)[1]) == port
    finally:
        if blocker is not None:
            ray.util.remove_placement_group(blocker)
        ray.kill(actor, no_restart=True)
        ray.shutdown()
