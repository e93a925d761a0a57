"""RayCluster on a local Ray instance: the same keyed rollouts as a LocalCluster, bit for bit,
and the fault drills through Ray (`ray.kill` of a rank actor and of the synchronizer actor
mid-step; Ray restarts them and they re-register).

One module, one order: a LocalCluster runs the reference steps and stops (so that at most
two engines run at a time), then the RayCluster starts and serves every test after it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.cluster import LocalCluster
from bubblespec.protocol.gateway import RolloutResponse
from bubblespec.tasks.addchain import MAX_STEPS
from tests.cluster.drills import check_result, fault_mid_step
from tests.cluster.helpers import process_group
from tests.deploy.helpers import engine_model_dir

ray = pytest.importorskip("ray")
from bubblespec.cluster.ray import RayCluster

pytestmark = [pytest.mark.engine, pytest.mark.slow]  # CI time (docs/results.md, run 17): make test-slow

KEYED = {"temperature": 1.0, "max_new_tokens": 200, "seed_mode": "keyed"}
LONG = {"temperature": 1.0, "max_new_tokens": 600, "ignore_eos": True}
SYNC_ARGS = ["--heartbeat-interval-s", "0.5", "--rank-timeout-s", "5"]


def _task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


def _keyed_steps(url: str) -> list[RolloutResponse]:
    """Two keyed steps, the first pre-generating the second's prompts in its bubble."""
    task = _task()
    now, nxt = task.make_prompts(4, 11), task.make_prompts(4, 12)
    with BubbleSpecClient(url, timeout_s=600) as c:
        a = c.rollout(now, n=2, sampling_params=KEYED, next_prompts=nxt)
        b = c.rollout(nxt, n=2, sampling_params=KEYED)
    return [a, b]


@pytest.fixture(scope="module")
def local_steps(tmp_path_factory: pytest.TempPathFactory) -> list[RolloutResponse]:
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    with LocalCluster(ranks=2, model=model, log_dir=tmp_path_factory.mktemp("local-logs"),
                      start_timeout_s=300) as c:
        return _keyed_steps(c.gateway_url)


@pytest.fixture(scope="module")
def cluster(local_steps: list[RolloutResponse],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    # Ray's memory monitor kills workers when the whole host passes 95% of its memory; on a
    # machine shared with other jobs that would kill ranks the drills did not aim at.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_memory_monitor_refresh_ms", "0")
        with RayCluster(ranks=2, model=engine_model_dir(), num_cpus=4, name="bstest",
                        sync_args=SYNC_ARGS, log_dir=str(tmp_path_factory.mktemp("ray-logs")),
                        start_timeout_s=300, grace_s=5) as c:
            yield c


@pytest.fixture(scope="module")
def client(cluster: RayCluster) -> Iterator[BubbleSpecClient]:
    with BubbleSpecClient(cluster.gateway_url, timeout_s=600) as c:
        yield c


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _kill_actor(name: str, cluster: RayCluster, pids: list[int]) -> Callable[[], None]:
    """A fault for `fault_mid_step`: `ray.kill` the role's actor (Ray restarts it) and wait
    until its processes are gone. `ray.kill` returns before the raylet kills the worker, and
    the reaper's SIGKILL follows that; resuming a frozen rank earlier lets it finish and
    answer its shard, which turns the drill into a fault-free step."""
    def fault() -> None:
        ray.kill(cluster.actors[name], no_restart=False)
        assert all(_gone(p, timeout_s=60) for p in pids), f"{name} outlived its actor"
    return fault


def _wait_back(client: BubbleSpecClient, rank_ids: set[str], timeout_s: float = 300) -> None:
    """Until the gateway sees every rank ready and registered (after a restart)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(BubbleSpecError):  # the gateway may briefly answer 503
            ranks = client.ranks()
            if {r.rank_id for r in ranks if r.ready and r.registered} >= rank_ids:
                return
        assert time.monotonic() < deadline, "ranks did not come back"
        time.sleep(1.0)


def test_ray_keyed_rollouts_equal_local_ones(cluster: RayCluster,
                                             local_steps: list[RolloutResponse]) -> None:
    ray_steps = _keyed_steps(cluster.gateway_url)
    assert [s.step for s in ray_steps] == [s.step for s in local_steps]
    for r, loc in zip(ray_steps, local_steps):
        assert r.warnings == [] and {x.rank_id for x in r.ranks if x.num_prompts} == {"r0", "r1"}
        assert r.output_ids() == loc.output_ids()
    assert ray_steps[1].counters.drafts_fetched_tokens > 0, ray_steps[1].counters
    names = {"sync": "SyncActor", "r0": "RankActor", "r1": "RankActor",
             "gateway": "GatewayActor"}  # what the Ray dashboard lists
    assert {f"bstest-{n}" for n in names} <= set(ray.util.list_named_actors())
    for n, cls in names.items():
        assert repr(ray.get_actor(f"bstest-{n}", namespace="bubblespec")).startswith(
            f"Actor({cls},"), n


@pytest.mark.slow  # ~1 min: a rank engine restart under Ray (make test-slow)
def test_rank_actor_killed_mid_step_is_rerun_and_comes_back(
        client: BubbleSpecClient, cluster: RayCluster) -> None:
    task = _task()
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 20 + i) for i in range(4)]
    old = cluster.info["r1"]
    server = process_group(old["pid"])  # rank server and engine processes, not the reaper
    out = fault_mid_step(client, cluster, "r1",
                          _kill_actor("r1", cluster, [old["pid"], *server]),
                          signal_rank=lambda sig: _signal_all(server, sig),
                          prompts=prompts, n=2, sampling_params=LONG)
    assert all(_gone(p) for p in [old["pid"], *server]), "the rank outlived its actor"
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    check_result(res, prompts, 2)
    assert res.reruns and all(r.from_rank == "r1" and r.to_rank == "r0" for r in res.reruns)
    assert {pr.rank_id for pr in res.prompts} == {"r0"}
    _wait_back(client, {"r0", "r1"})  # Ray restarted the actor; its server re-registered
    new = cluster.refresh("r1")
    assert new["incarnation"] == old["incarnation"] + 1 and new["address"] == old["address"]
    nxt = client.rollout(task.make_prompts(4, 13), n=2, sampling_params=KEYED)
    assert nxt.warnings == [] and {r.rank_id for r in nxt.ranks if r.num_samples} == {"r0", "r1"}


def test_sync_actor_killed_mid_step_loses_nothing(client: BubbleSpecClient,
                                                 cluster: RayCluster) -> None:
    task = _task()
    greedy = {"temperature": 0.0, "max_new_tokens": 400, "ignore_eos": True}
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 30 + i) for i in range(4)]
    clean = client.rollout(prompts, n=1, sampling_params=greedy, next_prompts=prompts)
    old = cluster.info["sync"]
    sync_server, r0_server = process_group(old["pid"]), process_group(cluster.info["r0"]["pid"])
    out = fault_mid_step(client, cluster, "r0",
                          _kill_actor("sync", cluster, [old["pid"], *sync_server]),
                          signal_rank=lambda sig: _signal_all(r0_server, sig),
                          prompts=prompts, n=1, sampling_params=greedy, next_prompts=prompts)
    assert all(_gone(p) for p in [old["pid"], *sync_server]), "the synchronizer outlived it"
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    check_result(res, prompts, 1)
    assert res.output_ids() == clean.output_ids()
    _wait_back(client, {"r0", "r1"}, timeout_s=60)  # same address, ranks re-registered
    new = cluster.refresh("sync")
    assert new["incarnation"] == old["incarnation"] + 1 and new["address"] == old["address"]
    again = client.rollout(prompts, n=1, sampling_params=greedy)
    assert again.warnings == [] and again.output_ids() == clean.output_ids()
