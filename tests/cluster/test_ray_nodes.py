"""Node drills: a RayCluster on three Ray nodes of this host (a head with the synchronizer and
the gateway, two worker nodes with one rank each, SPREAD), and the loss of a whole node.

- the head's synchronizer process killed mid-step: ranks on both worker nodes re-register
  with its successor and the step completes with the same samples as without the fault;
- a worker node frozen (every process of it SIGSTOPped) while its rank owes its shard,
  past bubblespec's heartbeat timeout but not Ray's: the synchronizer declares the rank
  LOST, the gateway drops its call and re-runs the shard on the other node; resumed, the
  stale rank re-registers, its late reply is never read, and it serves the next step;
- a worker node killed (every process of it SIGKILLed at once: raylet, Ray workers, the
  rank's reaper, server and vLLM engine core) while its rank owes its shard: the shard is
  re-run on the other node; when a new node joins, Ray re-places the bundle there, the rank
  comes back and serves the next step;
- a worker node's agent killed (its raylet alone SIGKILLed): no process of its rank is left
  after 10 s and its port is free; the rank comes back on a joining node, on the same port.

The nodes and every server listen on loopback.

Every drill checks that each sample of the step came back exactly once. The last test
stops the cluster and the nodes and checks that no process of the run (found by an
environment marker every role's process tree inherits, or by the Ray session directory)
and no actor state file is left. Marked `nodes` (`make test-nodes`) and slow.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.protocol.domain import RankState
from bubblespec.protocol.gateway import RolloutResponse
from bubblespec.synchronizer.errors import SyncError
from bubblespec.tasks.addchain import MAX_STEPS
from tests.cluster.drills import (
    check_result,
    fault_mid_step,
    rollout_in_thread,
    step_now,
    still_owes,
    sync_state,
    wait_decoding,
)
from tests.cluster.helpers import process_group
from tests.cluster.nodes import (
    LOOPBACK,
    WORKER_RESOURCE,
    RayNodes,
    ray_nodes,
    signal_all,
    wait_gone,
    with_cmdline,
    with_env,
)
from tests.deploy.helpers import engine_model_dir

ray = pytest.importorskip("ray")
from bubblespec.cluster.ray import RayCluster

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.nodes]

RANK_TIMEOUT_S = 5.0
SYNC_ARGS = ["--heartbeat-interval-s", "0.5", "--rank-timeout-s", str(RANK_TIMEOUT_S)]
LONG = {"temperature": 1.0, "max_new_tokens": 600, "ignore_eos": True}
GREEDY = {"temperature": 0.0, "max_new_tokens": 400, "ignore_eos": True}
KEYED = {"temperature": 1.0, "max_new_tokens": 200, "seed_mode": "keyed"}
MARK = "BUBBLESPEC_NODE_DRILL_RUN"
RANKS = {"r0", "r1"}
START_S = 900.0
"""A rank's start (imports, engine) on a loaded 2-core host: minutes."""


def _task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


@pytest.fixture(scope="module")
def nodes() -> Iterator[RayNodes]:
    if engine_model_dir() is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    with ray_nodes(workers=2) as n:
        yield n


@pytest.fixture(scope="module")
def cluster(nodes: RayNodes, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[RayCluster]:
    log_dir = tmp_path_factory.mktemp("ray-nodes-logs")
    run_id = uuid.uuid4().hex[:12]
    c = RayCluster(ranks=2, model=engine_model_dir(), address=nodes.address, name="bsnodes",
                   node_ip_address=LOOPBACK,
                   strategy="SPREAD", bundle_resources={WORKER_RESOURCE: 1},
                   sync_args=SYNC_ARGS, log_dir=str(log_dir), start_timeout_s=START_S, grace_s=5,
                   run_id=run_id, env={MARK: run_id, "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(cluster: RayCluster) -> Iterator[BubbleSpecClient]:
    with BubbleSpecClient(cluster.gateway_url, timeout_s=600) as c:
        yield c


def _wait_back(client: BubbleSpecClient, rank_ids: set[str], timeout_s: float = 300.0
               ) -> None:
    """Until the gateway sees every rank ready and registered."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(BubbleSpecError):
            ranks = client.ranks()
            if {r.rank_id for r in ranks if r.ready and r.registered} >= rank_ids:
                return
        assert time.monotonic() < deadline, f"ranks {sorted(rank_ids)} did not come back"
        time.sleep(1.0)


def _wait_for(what: str, check: Any, timeout_s: float, period_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(period_s)


def _rank_states(cluster: RayCluster) -> dict[str, RankState]:
    with contextlib.suppress(SyncError):
        return {r.rank_id: r.state for r in sync_state(cluster).ranks}
    return {}


def _failures(cluster: RayCluster, rank: str) -> float:
    """The gateway's count of failed calls to `rank` (its /metrics)."""
    try:
        text = httpx.get(cluster.gateway_url + "/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return -1.0
    m = re.search(rf'^bubblespec_gateway_rank_failures_total{{rank="{rank}"}} (\S+)$', text,
                  re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _exactly_once(res: RolloutResponse, prompts: list[Any], n: int) -> None:
    """Every sample of every prompt came back once, from one rank's reply."""
    check_result(res, prompts, n)
    ids = [(p.index, s.sample_index) for p in res.prompts for s in p.samples]
    assert sorted(ids) == [(i, j) for i in range(len(prompts)) for j in range(n)]


def _next_step_on_all_ranks(client: BubbleSpecClient, seed: int) -> RolloutResponse:
    nxt = client.rollout(_task().make_prompts(4, seed), n=2, sampling_params=KEYED)
    assert nxt.warnings == [], nxt.warnings
    assert {r.rank_id for r in nxt.ranks if r.num_samples} == RANKS
    _exactly_once(nxt, _task().make_prompts(4, seed), 2)
    return nxt


def test_ranks_sit_on_two_worker_nodes_and_the_roles_on_the_head(
        cluster: RayCluster, nodes: RayNodes, client: BubbleSpecClient) -> None:
    head = nodes.cluster.head_node.node_id
    workers = {n.node_id for n in nodes.nodes}
    assert cluster.info["sync"]["node_id"] == head and cluster.info["gateway"]["node_id"] == head
    assert {cluster.info[r]["node_id"] for r in RANKS} == workers  # one rank per worker node
    _next_step_on_all_ranks(client, 21)


def test_head_synchronizer_killed_on_three_nodes_ranks_reregister_and_the_step_completes(
        cluster: RayCluster, nodes: RayNodes, client: BubbleSpecClient) -> None:
    task = _task()
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 30 + i) for i in range(4)]
    clean = client.rollout(prompts, n=1, sampling_params=GREEDY, next_prompts=prompts)
    old = cluster.info["sync"]
    before = sync_state(cluster).instance_id
    server = process_group(old["pid"])  # the synchronizer's server process (under its reaper)
    assert server
    r0 = process_group(cluster.info["r0"]["pid"])

    def kill_sync() -> None:
        signal_all(server, signal.SIGKILL)
        assert not wait_gone(server, 30), "the synchronizer survived SIGKILL"

    out = fault_mid_step(client, cluster, "r0", kill_sync,
                         signal_rank=lambda sig: signal_all(r0, sig),
                         prompts=prompts, n=1, sampling_params=GREEDY, next_prompts=prompts)
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    _exactly_once(res, prompts, 1)
    assert res.output_ids() == clean.output_ids()
    # Ray restarted the actor on the head, on the same ports; ranks on both worker nodes
    # registered with the new synchronizer
    new = _wait_for("the synchronizer actor restarted", lambda: _refreshed(cluster, "sync",
                    old["incarnation"] + 1), 120)
    assert new["address"] == old["address"] and new["node_id"] == old["node_id"]

    def both_registered() -> bool:
        with contextlib.suppress(SyncError):
            s = sync_state(cluster)
            return s.instance_id != before and {r.rank_id for r in s.ranks
                                                if r.state is not RankState.LOST} >= RANKS
        return False

    _wait_for("both ranks registered with the new synchronizer", both_registered, 60)
    _wait_back(client, RANKS, 120)
    again = client.rollout(prompts, n=1, sampling_params=GREEDY)
    assert again.warnings == [] and again.output_ids() == clean.output_ids()
    assert {r.rank_id for r in again.ranks if r.num_samples} == RANKS


def _refreshed(cluster: RayCluster, name: str, incarnation: int) -> dict[str, Any] | None:
    with contextlib.suppress(ray.exceptions.RayError):
        info = cluster.refresh(name, timeout_s=5.0)
        if info["incarnation"] >= incarnation and info["alive"]:
            return info
    return None


def test_node_frozen_past_heartbeat_its_rank_is_lost_rerun_and_its_stale_reply_refused(
        cluster: RayCluster, nodes: RayNodes, client: BubbleSpecClient) -> None:
    _wait_back(client, RANKS, 120)
    old = cluster.refresh("r1")
    node = nodes.node_of(old["node_id"])
    pids = nodes.pids(node)
    assert old["pid"] in pids and set(process_group(old["pid"])) <= pids  # the rank is on the node
    task = _task()
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 20 + i) for i in range(4)]
    failures = _failures(cluster, "r1")
    for _attempt in range(3):
        before = step_now(cluster)
        t, out = rollout_in_thread(client, prompts=prompts, n=2, sampling_params=LONG)
        if not wait_decoding(cluster, "r1", before, t):
            t.join(300)
            assert "result" in out, out.get("error")
            continue
        signal_all(pids, signal.SIGSTOP)  # the whole node stops: raylet, workers, the rank
        try:
            if not still_owes(cluster, "r1", before):
                continue
            frozen = time.monotonic()
            _wait_for("r1 LOST at the synchronizer",
                      lambda: _rank_states(cluster).get("r1") is RankState.LOST,
                      RANK_TIMEOUT_S + 30)
            _wait_for("the gateway dropped r1's call",
                      lambda: _failures(cluster, "r1") > failures, 30)
        finally:
            signal_all(pids, signal.SIGCONT)
            resumed = time.monotonic()
            t.join(300)
        break
    else:
        raise AssertionError("r1 finished its shard before the freeze in 3 tries")
    assert resumed - frozen < 25, "frozen long enough for Ray to declare the node dead"
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    _exactly_once(res, prompts, 2)
    assert res.reruns and all(r.from_rank == "r1" and r.to_rank == "r0" for r in res.reruns)
    assert {s.rank_id for s in res.prompts} == {"r0"}  # nothing from the stale rank
    assert any("LOST" in w for w in res.warnings), res.warnings
    # resumed: same Ray actor and process (Ray never declared the node dead); the rank
    # re-registered on its own and serves the next step beside r0
    _wait_back(client, RANKS, 120)
    new = cluster.refresh("r1")
    assert (new["incarnation"], new["pid"], new["node_id"]) == (
        old["incarnation"], old["pid"], old["node_id"])
    assert any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes())
    nxt = _next_step_on_all_ranks(client, 22)
    assert nxt.step == res.step + 1


def test_node_killed_while_owing_a_shard_is_rerun_and_a_rejoining_node_gets_the_rank_back(
        cluster: RayCluster, nodes: RayNodes, client: BubbleSpecClient) -> None:
    _wait_back(client, RANKS, 120)
    old = cluster.refresh("r1")
    node = nodes.node_of(old["node_id"])
    pids = nodes.pids(node)
    rank = process_group(old["pid"])  # server and vLLM engine core
    assert old["pid"] in pids and set(rank) <= pids and len(rank) >= 2
    task = _task()
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 20 + i) for i in range(4)]
    killed: set[int] = set()

    def kill_node() -> None:
        killed.update(nodes.kill(node))
        assert not wait_gone(killed, 60), "a process of the killed node survived"

    out = fault_mid_step(client, cluster, "r1", kill_node,
                         signal_rank=lambda sig: signal_all(rank, sig),
                         prompts=prompts, n=2, sampling_params=LONG)
    assert pids <= killed and not wait_gone(pids, 5)
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    _exactly_once(res, prompts, 2)
    assert res.reruns and all(r.from_rank == "r1" and r.to_rank == "r0" for r in res.reruns)
    assert {s.rank_id for s in res.prompts} == {"r0"}
    # Ray declares the node dead; a new node joins; the placement group's bundle is placed
    # there and Ray restarts the rank's actor on it
    _wait_for("Ray declared the killed node dead", lambda: not any(
        n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()), 120, 1.0)
    joined = nodes.add_worker()
    new = _wait_for("r1's actor restarted on the new node",
                    lambda: _refreshed(cluster, "r1", old["incarnation"] + 1), 300, 1.0)
    assert new["node_id"] == joined.node_id
    bundles = ray.util.placement_group_table(cluster._pg)["bundles_to_node_id"]
    assert joined.node_id in bundles.values() and node.node_id not in bundles.values()
    _wait_back(client, RANKS, START_S)
    _next_step_on_all_ranks(client, 23)


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, int(port))) == 0


def _who(info: dict[str, Any]) -> str:
    """Who holds the rank's port (`ss`, where installed)."""
    port = info["address"].rsplit(":", 1)[1]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], check=False,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    return "(no ss)"


def test_node_agent_killed_its_rank_leaves_no_orphan_and_comes_back(
        cluster: RayCluster, nodes: RayNodes, client: BubbleSpecClient) -> None:
    """The raylet alone SIGKILLed (the machine lives): Ray's worker exits and SIGKILLs its
    children, the rank's reaper among them; the reaper's sentinel takes the server and the
    vLLM engine core within seconds, so nothing holds the port (or, on a GPU node, the GPU)
    when Ray places the rank again on a joining node."""
    _wait_back(client, RANKS, 120)
    old = cluster.refresh("r0")
    node = nodes.node_of(old["node_id"])
    group = [old["pid"], *process_group(old["pid"])]  # reaper, sentinel, server, engine core
    assert len(group) >= 4 and _listening(old["address"])
    killed = time.monotonic()
    nodes.kill_agent(node)
    left = wait_gone(group, 10)
    assert not left, f"the rank outlived its raylet: {_cmdlines(left)}"
    while _listening(old["address"]):  # a dying process's last threads may hold it briefly
        assert time.monotonic() - killed < 10, f"the lost rank's port still bound: {_who(old)}"
        time.sleep(0.1)
    _wait_for("Ray declared the node dead", lambda: not any(
        n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()), 120, 1.0)
    joined = nodes.add_worker()
    new = _wait_for("r0's actor restarted on the new node",
                    lambda: _refreshed(cluster, "r0", old["incarnation"] + 1), 300, 1.0)
    assert new["node_id"] == joined.node_id and new["address"] == old["address"]
    _wait_back(client, RANKS, START_S)
    assert _listening(new["address"])
    _next_step_on_all_ranks(client, 24)


def test_teardown_leaves_no_process_or_state_file(cluster: RayCluster, nodes: RayNodes
                                                  ) -> None:
    log_dir = Path(str(cluster.log_dir))
    assert with_env(MARK, cluster.run_id), "the marker does not reach the roles' processes"
    cluster.stop()
    left = [p for p in with_env(MARK, cluster.run_id) if wait_gone([p], 30)]
    assert not left, f"processes of the run left after stop: {_cmdlines(left)}"
    assert not list(log_dir.rglob("*.state.json")), "actor state files left"
    session = nodes.session_dir
    nodes.shutdown()
    left = [p for p in with_cmdline(session) if wait_gone([p], 30)]
    assert not left, f"Ray processes left after the nodes' shutdown: {_cmdlines(left)}"


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for p in pids:
        with contextlib.suppress(OSError):
            out.append(f"{p}: " + Path(f"/proc/{p}/cmdline").read_bytes()
                       .replace(b"\0", b" ").decode(errors="replace")[:200])
    return out
