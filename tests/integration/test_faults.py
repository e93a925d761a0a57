"""Fault drills against a real cluster (synchronizer, two ranks with real engines, gateway,
all child processes of one `LocalCluster` shared by the module): bad checkpoints, versions
going backwards, a rank's engine killed under it, and a rank whose engine restarts are spent.

Every drill ends with a normal rollout that must succeed, with no restart by hand. Order
matters: the engine kills come last, and the last one leaves rank r0 exited: the cluster
does not supervise its children here (`supervise=False`), so what a rank does on its own is
what is checked (tests/cluster/test_supervised.py has the cluster restart an exited rank).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.cluster import LocalCluster
from bubblespec.rank.service import EXIT_ENGINE
from tests.cluster.helpers import local_cluster
from tests.engine.bad_checkpoints import BAD_KINDS, make_bad_checkpoint

pytestmark = pytest.mark.engine

SAMPLING = {"temperature": 1.0, "max_new_tokens": 40}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(
        tmp_path_factory, sync_args=["--heartbeat-interval-s", "0.5", "--rank-timeout-s", "5"],
        rank_args=["--engine-restarts", "1", "--engine-check-s", "0.2"], supervise=False)


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[BubbleSpecClient]:
    with BubbleSpecClient(cluster.gateway_url, timeout_s=600) as c:
        yield c


@pytest.fixture(scope="module")
def model(cluster: LocalCluster) -> Path:
    assert cluster.model is not None
    return Path(cluster.model)


def versions(client: BubbleSpecClient) -> dict[str, int | None]:
    return {r.rank_id: r.weight_version for r in client.ranks()}


def rollout_works(client: BubbleSpecClient, seed: int) -> Any:
    from bubblespec.tasks import default_task

    prompts = default_task().make_prompts(4, seed)
    res = client.rollout(prompts, n=2, sampling_params=SAMPLING)
    assert len(res.prompts) == 4
    assert all(len(p.samples) == 2 and all(s.output_ids for s in p.samples)
               for p in res.prompts)
    return res


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def health(cluster: LocalCluster, rank: str) -> int:
    try:
        return httpx.get(cluster.rank_urls[rank] + "/health_generate", timeout=10).status_code
    except httpx.HTTPError:
        return 0


def kill_engine_core(cluster: LocalCluster, rank: str) -> None:
    """SIGKILL the engine-core process under a running rank (the rank itself stays)."""
    proc = cluster.children[rank].proc
    assert proc is not None and proc.poll() is None
    cores = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
    assert cores, f"no EngineCore process under {rank}"
    for p in cores:
        p.send_signal(signal.SIGKILL)


def test_bad_checkpoints_are_refused_and_rollouts_go_on(
        client: BubbleSpecClient, cluster: LocalCluster, model: Path, tmp_path: Path) -> None:
    before = versions(client)
    for kind, reason in sorted(BAD_KINDS.items()):
        bad = make_bad_checkpoint(kind, model, tmp_path / kind)
        with pytest.raises(BubbleSpecError) as e:
            client.update_weights(str(bad))
        assert e.value.status == 422 and e.value.field == "path", (kind, e.value)
        assert reason in e.value.detail and "r0" in e.value.detail and "r1" in e.value.detail
        assert versions(client) == before, kind
    # the rank's own route answers the same refusal
    r = httpx.post(cluster.rank_urls["r1"] + "/v1/weights",
                   json={"path": str(tmp_path / "truncated")}, timeout=60)
    assert r.status_code == 422 and r.json()["field"] == "path"
    assert "truncated" in r.json()["detail"]
    res = rollout_works(client, 501)
    assert res.weight_versions == [max(v or 0 for v in before.values())]
    assert all(health(cluster, rank) == 200 for rank in cluster.rank_ids)


def test_versions_only_go_up_unless_forced(client: BubbleSpecClient, model: Path,
                                           tmp_path: Path) -> None:
    good = tmp_path / "good"
    shutil.copytree(model, good)
    v = max(x or 0 for x in versions(client).values())
    assert client.update_weights(str(good), version=v + 5).weight_version == v + 5
    for older in (v + 5, v + 1):
        with pytest.raises(BubbleSpecError) as e:
            client.update_weights(str(good), version=older)
        assert e.value.status == 409 and e.value.field == "version"
    assert set(versions(client).values()) == {v + 5}
    w = client.update_weights(str(good), version=v + 3, force=True)
    assert w.ranks == {"r0": v + 3, "r1": v + 3}
    assert client.update_weights(str(good)).weight_version == v + 4
    assert rollout_works(client, 502).weight_versions == [v + 4]


def test_engine_killed_the_rank_restarts_it(client: BubbleSpecClient,
                                            cluster: LocalCluster) -> None:
    before = versions(client)
    kill_engine_core(cluster, "r0")
    wait_for(lambda: health(cluster, "r0") == 503, 20, "r0 /health_generate 503")
    body = httpx.get(cluster.rank_urls["r0"] + "/health_generate", timeout=2).json()
    assert body["status"] == "engine_dead"
    state = httpx.get(cluster.rank_urls["r0"] + "/v1/state", timeout=2).json()["state"]
    assert state == "engine_dead"
    ranks = {r.rank_id: r for r in client.ranks()}
    assert not ranks["r0"].ready and ranks["r1"].ready
    res = rollout_works(client, 503)  # routed around r0 (or on its new engine)
    assert res.weight_versions == [before["r1"]]
    wait_for(lambda: health(cluster, "r0") == 200, 600, "r0's engine restarted")
    assert versions(client) == before  # the last good weights and their version
    metrics = httpx.get(cluster.rank_urls["r0"] + "/metrics", timeout=5).text
    assert 'bubblespec_rank_engine_restarts_total{rank="r0"} 1.0' in metrics
    assert 'bubblespec_rank_engine_alive{rank="r0"} 1.0' in metrics
    wait_for(lambda: all(r.ready for r in client.ranks()), 30, "the gateway sees r0 again")
    res = rollout_works(client, 504)
    assert {r.rank_id for r in res.ranks if r.num_prompts} == {"r0", "r1"}


def test_restarts_spent_the_rank_exits(client: BubbleSpecClient,
                                       cluster: LocalCluster) -> None:
    kill_engine_core(cluster, "r0")
    proc = cluster.children["r0"].proc
    assert proc is not None
    assert proc.wait(timeout=60) == EXIT_ENGINE
    assert "restart(s) are spent" in cluster.children["r0"].log_tail(80)
    res = rollout_works(client, 505)
    assert {r.rank_id for r in res.ranks if r.num_prompts} == {"r1"}
